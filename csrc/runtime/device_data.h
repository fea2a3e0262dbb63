// A tensor that lives on the emulated devices: its global type, its layout (Sharding) and one
// buffer per device. Devices holding the same tile (replicas) share one host tensor, but each
// device accounts for its bytes. Immutable once built, so it can be shared freely.
#pragma once
#include <ATen/Tensor.h>

#include <memory>
#include <vector>

#include "ir/node.h"
#include "runtime/device_set.h"

namespace spmd::runtime {

struct DeviceBuffer {
  at::Tensor tensor;  // the device's (padded) shard, on the host
  Allocation alloc;
};
using BufferPtr = std::shared_ptr<DeviceBuffer>;

// Wraps `tensor` as device `device`'s buffer, charging its bytes to that device.
BufferPtr MakeBuffer(int64_t device, at::Tensor tensor, const std::string& label);
BufferPtr MakeBuffer(int64_t device, at::Tensor tensor, const std::string* interned_label);
// Buffers for `devices`, all holding `tensor` (one allocation block, one lock): out[d] is set
// for each listed device d. They are released together.
void MakeSharedBuffers(const std::vector<size_t>& devices, const at::Tensor& tensor,
                       const std::string* interned_label, std::vector<BufferPtr>& out);
// One buffer per device, all sharing `tensor` (a replicated value).
std::vector<BufferPtr> MakeReplicatedBuffers(const at::Tensor& tensor, const std::string& label);

class DeviceData final : public ir::DataHandle {
 public:
  // `sharding` invalid means replicated on every device.
  DeviceData(TensorType type, Sharding sharding, std::vector<BufferPtr> shards);

  const TensorType& type() const override { return type_; }
  const Sharding& sharding() const override { return sharding_; }
  const std::vector<BufferPtr>& shards() const { return shards_; }
  const at::Tensor& shard(int64_t device) const;
  // Shape, dtype and layout without buffers (plan mode, runtime/plan_mode.h): reading its
  // values throws PlannedDataError; relaying it out gives planned data again.
  static std::shared_ptr<DeviceData> Planned(TensorType type, Sharding sharding);
  bool planned() const { return planned_; }
  // Bytes one device holds of it (its padded shard), whether planned or real.
  int64_t BytesPerDevice() const;
  bool is_replicated() const { return !sharding_.valid() || sharding_.IsReplicated(); }
  // Lays a host tensor out over the devices: each device gets its (zero-padded) shard.
  static std::shared_ptr<DeviceData> FromHost(const at::Tensor& host, const Sharding& sharding);
  // The global value on the host: tiles stitched together, padding dropped, pending partial
  // sums reduced.
  at::Tensor ToHost() const;
  // Same data laid out with another sharding (through the host; used for mark_sharding of
  // device data, where the data moves once at annotation time).
  std::shared_ptr<DeviceData> Relayout(const Sharding& target) const;

 private:
  TensorType type_;
  Sharding sharding_;
  std::vector<BufferPtr> shards_;
  bool planned_ = false;
};
using DeviceDataPtr = std::shared_ptr<DeviceData>;

// Conversions between the torch-free DType and c10::ScalarType (same numbering).
c10::ScalarType ToScalarType(DType dtype);
DType FromScalarType(c10::ScalarType type);
TensorType TypeOf(const at::Tensor& t);

// The sub-tensor of `global` held by `device` under `sharding`, zero-padded to the shard shape.
at::Tensor ExtractShard(const at::Tensor& global, const Sharding& sharding, int64_t device);

}  // namespace spmd::runtime
