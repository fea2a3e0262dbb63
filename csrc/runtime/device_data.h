// A tensor that lives on the emulated devices: its global type, its layout (Sharding) and one
// buffer per device. Devices holding the same tile (replicas) share one host tensor, but each
// device accounts for its bytes. Immutable once built, so it can be shared freely (data held on
// the host gets its buffers once, on first need: the value never changes).
#pragma once
#include <ATen/Tensor.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <vector>

#include "ir/node.h"
#include "runtime/device_set.h"
#include "runtime/stacked.h"

namespace spmd::runtime {

struct DeviceBuffer {
  at::Tensor tensor;  // the device's (padded) shard, on the host
  Allocation alloc;
};
using BufferPtr = std::shared_ptr<DeviceBuffer>;
using PerDevice = std::vector<BufferPtr>;  // one buffer per device

// Wraps `tensor` as device `device`'s buffer, charging its bytes to that device.
BufferPtr MakeBuffer(int64_t device, at::Tensor tensor, const std::string& label);
BufferPtr MakeBuffer(int64_t device, at::Tensor tensor, const std::string* interned_label);
// One buffer per device, all sharing `tensor` (a replicated value).
std::vector<BufferPtr> MakeReplicatedBuffers(const at::Tensor& tensor, const std::string& label);

class DeviceData final : public ir::DataHandle,
                         public std::enable_shared_from_this<DeviceData> {
 public:
  // `sharding` invalid means replicated on every device. `stacked` (optional) holds the same
  // shards stacked (stacked.h), as the executor produced them.
  DeviceData(TensorType type, Sharding sharding, std::vector<BufferPtr> shards,
             Stacked stacked = {});
  ~DeviceData() override;

  const TensorType& type() const override { return type_; }
  const Sharding& sharding() const override { return sharding_; }
  // (Of data held on the host, reading the shards uploads it first.)
  const std::vector<BufferPtr>& shards() const {
    Upload();
    return shards_;
  }
  const at::Tensor& shard(int64_t device) const;
  // The shards stacked: as produced, or stacked now (once) from the shards.
  const Stacked& stacked() const;
  // Shape, dtype and layout without buffers (plan mode, runtime/plan_mode.h): reading its
  // values throws PlannedDataError; relaying it out gives planned data again. `known`, when
  // defined, is its global value on the host (KeepsKnownValue): reading gives it, and a real
  // step runs on it (Materialized).
  static std::shared_ptr<DeviceData> Planned(TensorType type, Sharding sharding,
                                             at::Tensor known = {});
  bool planned() const { return planned_; }
  bool known() const { return known_.defined(); }
  // Made by host bookkeeping (aten/host_bookkeeping.h): ops on it alone run on the host too.
  // Set once, right after it is made, before anything else holds it.
  bool host_bookkeeping() const { return host_bookkeeping_; }
  void set_host_bookkeeping() { host_bookkeeping_ = true; }
  // Whether plan mode keeps the value of planned data of this type: integer and boolean
  // values (token ids, positions, masks, counts; what Python code reads to decide what to
  // run) of at most kKnownValueBytes. They are cheap to know and to compute from factories.
  static bool KeepsKnownValue(const TensorType& type);
  static constexpr int64_t kKnownValueBytes = 16 << 20;
  // Real data with the value of known planned data (laid out alike); real data itself.
  // Planned data without a value throws PlannedDataError("run a step that reads it").
  std::shared_ptr<DeviceData> Materialized() const;
  // Bytes one device holds of it (its padded shard), whether planned or real.
  int64_t BytesPerDevice() const;
  bool is_replicated() const { return !sharding_.valid() || sharding_.IsReplicated(); }
  // Lays a host tensor out over the devices: each device gets its (zero-padded) shard.
  static std::shared_ptr<DeviceData> FromHost(const at::Tensor& host, const Sharding& sharding);
  // A host tensor moved to the device and held on the host until it is used (PyTorch/XLA's
  // SPMD virtual device): annotating it lays out only its shards, so a model moved to the
  // device and then sharded never occupies each device whole; the first use in a graph (or
  // any read of its shards) uploads it replicated. Planning: planned data, as FromHost.
  static std::shared_ptr<DeviceData> HeldOnHost(const at::Tensor& host);
  // Still held on the host: no device has received it yet.
  bool held_on_host() const { return held_.defined() && !uploaded_.load(std::memory_order_acquire); }
  // Lays data held on the host out on every device (replicated); otherwise nothing.
  void Upload() const;
  // The global value on the host: tiles stitched together, padding dropped, pending partial
  // sums reduced.
  at::Tensor ToHost() const;
  // Same data laid out with another sharding (through the host; used for mark_sharding of
  // device data, where the data moves once at annotation time).
  std::shared_ptr<DeviceData> Relayout(const Sharding& target) const;

 private:
  TensorType type_;
  Sharding sharding_;
  mutable std::vector<BufferPtr> shards_;  // (filled by Upload for data held on the host)
  mutable Stacked stacked_;
  mutable std::once_flag stack_once_;
  at::Tensor held_;  // HeldOnHost's tensor (also the replicas' buffer once uploaded)
  mutable std::once_flag upload_once_;
  mutable std::atomic<bool> uploaded_{false};
  bool planned_ = false;
  bool host_bookkeeping_ = false;
  at::Tensor known_;  // planned data's value, when known
};
using DeviceDataPtr = std::shared_ptr<DeviceData>;

// Conversions between the torch-free DType and c10::ScalarType (same numbering).
c10::ScalarType ToScalarType(DType dtype);
DType FromScalarType(c10::ScalarType type);
TensorType TypeOf(const at::Tensor& t);

// Writes the sub-tensor of `global` held by `device` under `sharding` into `out` (of the shard
// shape), zero-padded.
void ExtractShardInto(const at::Tensor& global, const Sharding& sharding, int64_t device,
                      at::Tensor out);

}  // namespace spmd::runtime
