// Sharding annotations on spmd tensors (the C++ side of xs.mark_sharding and friends).
#pragma once
#include <ATen/Tensor.h>

#include <string>
#include <vector>

#include "aten/lazy_tensor.h"
#include "sharding/sharding.h"

namespace spmd::aten {

// Interned meshes: equal meshes share one object, so shardings compare cheaply.
MeshPtr InternMesh(std::vector<int64_t> device_ids, std::vector<int64_t> shape,
                   std::vector<std::string> axis_names);

// Annotates `t` in place. Device data is laid out over the devices now (each device then holds
// only its shard); a pending value gets a sharding constraint node. Re-annotating device data
// with a different non-replicated sharding raises, as in PyTorch/XLA.
void MarkSharding(const at::Tensor& t, const Sharding& sharding);
// PyTorch/XLA's annotate_custom_sharding: annotates `t` in place with a sharding constraint on
// its current value, device data included (which keeps its layout until the step computes the
// constrained value, resharding it there), instead of laying the data out now.
void ConstrainSharding(const at::Tensor& t, const Sharding& sharding);
// After an in-place op replaced the value behind a functional tensor: the new value takes the
// annotation of the one it replaced (`previous`), so the tensor keeps the user's layout.
void CarryAnnotation(const SlotPtr& previous, const at::Tensor& updated);
// Applies the updates queued on a functional tensor's storage now. Parameters are views
// (nn.Parameter detaches the tensor it wraps) whose base nobody reads, so their updates would
// queue up forever, each pinning a device buffer. The same scatters are recorded either way.
void ApplyQueuedUpdates(const at::Tensor& t);
// Writes `value` (an unwrapped spmd tensor) into functional tensor `t` as an in-place op does:
// t's aliases see it (a parameter and the detached copies in its state_dict share storage), t
// keeps the annotation of its value before (`previous`, held here: replacing the value may
// free the LazyImpl that held it), and the update is applied at once (ApplyQueuedUpdates).
void CommitInPlace(const at::Tensor& t, const at::Tensor& value, SlotPtr previous);
// Removes the annotation: device data is gathered back to replicated; a pending constraint is
// dropped.
void ClearSharding(const at::Tensor& t);
// The layout of `t`: its data's sharding, or its pending constraint's. Invalid when none.
Sharding GetSharding(const at::Tensor& t);
// XLA text form, "" when `t` has no sharding.
std::string GetShardingSpec(const at::Tensor& t);
// Whether `t` is device data still held on the host (runtime::DeviceData::HeldOnHost).
bool HeldOnHost(const at::Tensor& t);

// Manual sharding (PyTorch/XLA's SPMDFullToShardShape / SPMDShardToFullShape / {manual}).
// FullToShard: `t` must carry a tiled sharding S; the result is each device's padded shard of
// it as a tensor of its own (shape S.ShardShape), which ops then transform device by device.
at::Tensor FullToShard(const at::Tensor& t);
// ShardToFull: the devices' manual tensors `t` become the shards of a `full_shape` tensor laid
// out as `sharding`.
at::Tensor ShardToFull(const at::Tensor& t, const Sharding& sharding, const Shape& full_shape);
// Marks a pending value computed from manual ones as manual ({manual}); device data raises.
void MarkManualSharding(const at::Tensor& t);

struct LocalShard {
  int64_t device;
  at::Tensor data;                 // padded shard, a host copy
  std::vector<int64_t> offsets;    // per dim, clamped to the tensor shape
  std::vector<int64_t> lengths;    // unpadded
  int64_t replica_id;
};
// One shard per device, materializing `t` first.
std::vector<LocalShard> GetLocalShards(const at::Tensor& t);
// A new spmd tensor holding the host tensor `host` laid out as `sharding`: each device receives
// only its (padded) shard, with no transient replicated copy (xm.send_cpu_data_to_device with an
// input sharding).
at::Tensor UploadSharded(const at::Tensor& host, const Sharding& sharding);
// Replaces `t`'s data with per-device shards (padded shapes) in its current sharding.
void LoadLocalShards(const at::Tensor& t, const std::vector<at::Tensor>& shards);

}  // namespace spmd::aten
