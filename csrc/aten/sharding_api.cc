#include "aten/sharding_api.h"

#include <ATen/ATen.h>
#include <ATen/FunctionalStorageImpl.h>
#include <ATen/FunctionalTensorWrapper.h>

#include <algorithm>
#include <map>
#include <mutex>

#include "aten/lazy_tensor.h"
#include "aten/recorder.h"
#include "aten/sync.h"
#include "core/metrics.h"
#include "ir/internal_ops.h"
#include "runtime/process_span.h"
#include "runtime/device_data.h"
#include "runtime/plan_mode.h"

namespace spmd::aten {

namespace {

runtime::DeviceDataPtr DataOf(const ir::Value& v) {
  return std::static_pointer_cast<runtime::DeviceData>(v.node->data());
}

bool IsReplicatedOrNone(const Sharding& s) { return !s.valid() || s.IsReplicated(); }

// Constrains the slot's value to `sharding` in the graph (propagation treats it as a user
// annotation): a constraint already there is replaced, not stacked.
void Constrain(const SlotPtr& slot, const Sharding& sharding) {
  ir::Value input = slot->value;
  if (input.node->op() == ir::InternalOps::Get().sharding_constraint) input = input.node->input(0);
  ir::NodePtr node = ir::MakeNode(ir::InternalOps::Get().sharding_constraint, {input},
                                  {ir::Arg::Tensor(0)}, {input.type()});
  node->set_shardings({sharding});
  SetSlotValue(slot, ir::Value{node, 0});
}

// The user's annotation of `t` (its rank checked, counted), kept on its slot; the slot.
// (The caller holds GraphMutex.)
const SlotPtr& Annotate(const at::Tensor& t, const Sharding& sharding, const char* what) {
  const SlotPtr& slot = GetLazyImpl(t, what)->slot();
  const int64_t rank = slot->value.type().rank();
  TORCH_CHECK(sharding.rank() == rank, "sharding rank ", sharding.rank(),
              " does not match the tensor rank ", rank);
  Count("MarkSharding");
  slot->annotation = sharding;
  return slot;
}

}  // namespace

MeshPtr InternMesh(std::vector<int64_t> device_ids, std::vector<int64_t> shape,
                   std::vector<std::string> axis_names) {
  static std::mutex mu;
  static auto* meshes = new std::map<Hash, std::vector<MeshPtr>>();
  auto mesh = std::make_shared<const Mesh>(std::move(device_ids), std::move(shape),
                                           std::move(axis_names));
  std::lock_guard<std::mutex> lock(mu);
  auto& bucket = (*meshes)[mesh->hash()];
  for (const MeshPtr& m : bucket)
    if (*m == *mesh) return m;
  bucket.push_back(mesh);
  return mesh;
}

void MarkSharding(const at::Tensor& t, const Sharding& sharding) {
  std::lock_guard<GraphLock> lock(GraphMutex());
  const SlotPtr& slot = Annotate(t, sharding, "mark_sharding");
  if (slot->value.node->is_data()) {
    runtime::DeviceDataPtr data = DataOf(slot->value);
    const Sharding& current = data->sharding();
    if (current.valid() && current.SamePlacement(sharding)) return;  // re-marking: a no-op
    TORCH_CHECK(IsReplicatedOrNone(current),
                "Existing annotation must be cleared first: the tensor is sharded as ",
                current.ToString(), ", requested ", sharding.ToString());
    Count("ReshardDeviceData");
    SetSlotValue(slot, ir::Value{ir::MakeDataNode(data->Relayout(sharding)), 0});
    return;
  }
  Constrain(slot, sharding);
}

void ConstrainSharding(const at::Tensor& t, const Sharding& sharding) {
  std::lock_guard<GraphLock> lock(GraphMutex());
  Constrain(Annotate(t, sharding, "annotate_custom_sharding"), sharding);
}

void CarryAnnotation(const SlotPtr& previous, const at::Tensor& updated) {
  if (!previous || !previous->annotation.valid()) return;
  std::lock_guard<GraphLock> lock(GraphMutex());
  LazyImpl* impl = TryGetLazyImpl(updated);
  if (!impl || impl->slot() == previous || impl->slot()->annotation.valid()) return;
  const SlotPtr& slot = impl->slot();
  const Sharding& sharding = previous->annotation;
  slot->annotation = sharding;
  if (slot->value.node->is_data()) {  // e.g. copy_ from the host uploaded a fresh value
    runtime::DeviceDataPtr data = DataOf(slot->value);
    if (!(data->sharding().valid() && data->sharding() == sharding))
      SetSlotValue(slot, ir::Value{ir::MakeDataNode(data->Relayout(sharding)), 0});
    return;
  }
  Constrain(slot, sharding);
}

void ApplyQueuedUpdates(const at::Tensor& t) {
  if (auto* storage = dynamic_cast<at::functionalization::FunctionalStorageImpl*>(
          t.storage().unsafeGetStorageImpl()))
    storage->apply_updates();
}

void CommitInPlace(const at::Tensor& t, const at::Tensor& value, SlotPtr previous) {
  namespace F = at::functionalization::impl;
  F::replace_(t, value);
  F::commit_update(t);
  F::sync(t);
  CarryAnnotation(previous, t);
  ApplyQueuedUpdates(t);
}

void ClearSharding(const at::Tensor& t) {
  std::lock_guard<GraphLock> lock(GraphMutex());
  LazyImpl* impl = GetLazyImpl(t, "clear_sharding");
  const SlotPtr& slot = impl->slot();
  slot->annotation = Sharding();
  if (slot->value.node->is_data()) {
    runtime::DeviceDataPtr data = DataOf(slot->value);
    if (!data->sharding().valid()) return;
    if (data->planned()) {  // plan mode: only the layout changes, there is nothing to move
      SetSlotValue(slot, ir::Value{ir::MakeDataNode(data->Relayout(Sharding())), 0});
      return;
    }
    at::Tensor host = data->ToHost();
    SetSlotValue(slot, ir::Value{ir::MakeDataNode(runtime::DeviceData::FromHost(host, Sharding())), 0});
    return;
  }
  if (slot->value.node->op() == ir::InternalOps::Get().sharding_constraint)
    SetSlotValue(slot, slot->value.node->input(0));
}

bool HeldOnHost(const at::Tensor& t) {
  std::lock_guard<GraphLock> lock(GraphMutex());
  const ir::Value& v = GetLazyImpl(t)->slot()->value;
  return v.node->is_data() && DataOf(v)->held_on_host();
}

Sharding GetSharding(const at::Tensor& t) {
  std::lock_guard<GraphLock> lock(GraphMutex());
  LazyImpl* impl = GetLazyImpl(t);
  const ir::Value& v = impl->slot()->value;
  if (v.node->is_data()) return DataOf(v)->sharding();
  const auto& ops = ir::InternalOps::Get();
  if (v.node->op() == ops.sharding_constraint || v.node->op() == ops.shard_to_full)
    return v.node->shardings().at(0);
  if (v.node->op() == ops.full_to_shard)
    return Sharding::Manual(v.node->shardings().at(0).mesh_ptr(), v.type().rank());
  return Sharding();
}

std::string GetShardingSpec(const at::Tensor& t) {
  Sharding s = GetSharding(t);
  // A pending partial sum is an implementation detail: users see the tiling.
  return s.valid() ? s.WithoutPartial().ToString() : "";
}

at::Tensor FullToShard(const at::Tensor& t) {
  std::lock_guard<GraphLock> lock(GraphMutex());
  LazyImpl* impl = GetLazyImpl(t, "_spmd_full_to_shard_shape");
  Sharding s = GetSharding(t);
  // (A replicated annotation, which a mesh of one device gives every spec, is a tiling into
  // one tile: each device's shard is the whole tensor, as PyTorch/XLA takes it.)
  TORCH_CHECK(s.valid() && !s.is_manual() && !s.IsPartial(),
              "_spmd_full_to_shard_shape needs a tensor with a tiled sharding (mark_sharding "
              "first), got ", s.valid() ? s.ToString() : std::string("no sharding"));
  const ir::Value& in = impl->slot()->value;
  TensorType shard{in.type().dtype, s.ShardShape(in.type().shape)};
  ir::NodePtr node =
      ir::MakeNode(ir::InternalOps::Get().full_to_shard, {in}, {ir::Arg::Tensor(0)}, {shard});
  node->set_shardings({s});
  return WrapOutput(ir::Value{node, 0}, /*factory=*/true);
}

at::Tensor ShardToFull(const at::Tensor& t, const Sharding& sharding, const Shape& full_shape) {
  std::lock_guard<GraphLock> lock(GraphMutex());
  LazyImpl* impl = GetLazyImpl(t, "_spmd_shard_to_full_shape");
  const ir::Value& in = impl->slot()->value;
  TORCH_CHECK(sharding.valid() && !sharding.is_manual() && !sharding.IsPartial() &&
                  sharding.rank() == static_cast<int64_t>(full_shape.size()),
              "_spmd_shard_to_full_shape needs a tiled sharding of rank ", full_shape.size(),
              ", got ", sharding.valid() ? sharding.ToString() : std::string("none"));
  TORCH_CHECK(sharding.ShardShape(full_shape) == in.type().shape, "a ", ShapeToString(full_shape),
              " tensor laid out as ", sharding.ToString(), " has shards of ",
              ShapeToString(sharding.ShardShape(full_shape)), ", not ",
              ShapeToString(in.type().shape));
  TensorType full{in.type().dtype, full_shape};
  ir::NodePtr node =
      ir::MakeNode(ir::InternalOps::Get().shard_to_full, {in}, {ir::Arg::Tensor(0)}, {full});
  node->set_shardings({sharding});
  return WrapOutput(ir::Value{node, 0}, /*factory=*/true);
}

void MarkManualSharding(const at::Tensor& t) {
  std::lock_guard<GraphLock> lock(GraphMutex());
  LazyImpl* impl = GetLazyImpl(t, "_mark_manual_sharding");
  const SlotPtr& slot = impl->slot();
  TORCH_CHECK(!slot->value.node->is_data(),
              "_mark_manual_sharding marks a value computed in a manual region "
              "(enable_manual_sharding); this tensor is device data");
  const TensorType& type = slot->value.type();
  int64_t n = runtime::GlobalDeviceCount();
  std::vector<int64_t> ids(n);
  for (int64_t i = 0; i < n; ++i) ids[i] = i;
  Sharding manual = Sharding::Manual(InternMesh(ids, {n}, {}), type.rank());
  ir::NodePtr node = ir::MakeNode(ir::InternalOps::Get().sharding_constraint, {slot->value},
                                  {ir::Arg::Tensor(0)}, {type});
  node->set_shardings({manual});
  SetSlotValue(slot, ir::Value{node, 0});
}

std::vector<LocalShard> GetLocalShards(const at::Tensor& t) {
  std::lock_guard<GraphLock> lock(GraphMutex());
  LazyImpl* impl = GetLazyImpl(t);
  runtime::DeviceDataPtr data = Materialize(impl->slot());
  if (data->planned()) throw runtime::PlannedDataError("read its local shards");
  if (data->sharding().valid() && data->sharding().IsPartial()) {
    // Shards of a pending partial sum are not pieces of the tensor: reduce them first.
    data = data->Relayout(data->sharding().WithoutPartial());
    SetSlotValue(impl->slot(), ir::Value{ir::MakeDataNode(data), 0});
  }
  const Sharding& s = data->sharding();
  const Shape& shape = data->type().shape;
  // XLA numbers the replicas of a tile by their position in the sorted list of devices
  // holding it.
  std::map<std::vector<int64_t>, std::vector<int64_t>> holders;
  auto tile_of = [&](int64_t dev) {
    std::vector<int64_t> tile;
    for (int64_t d = 0; s.valid() && d < s.rank(); ++d) tile.push_back(s.TileIndex(d, dev));
    return tile;
  };
  // (With several processes, only this process's devices are local: global ids first...)
  const int64_t first = runtime::FirstLocalDevice();
  for (int64_t dev = 0; dev < runtime::GlobalDeviceCount(); ++dev) holders[tile_of(dev)].push_back(dev);
  std::vector<LocalShard> out;
  int64_t n = static_cast<int64_t>(data->shards().size());
  for (int64_t local = 0; local < n; ++local) {
    const int64_t dev = first + local;
    LocalShard shard;
    shard.device = dev;
    shard.data = data->shard(local).clone();
    for (size_t d = 0; d < shape.size(); ++d) {
      bool tiled = s.valid() && s.NumTiles(d) > 1;
      shard.offsets.push_back(tiled ? s.ShardOffset(shape, d, dev) : 0);
      shard.lengths.push_back(tiled ? s.ShardLength(shape, d, dev) : shape[d]);
    }
    const std::vector<int64_t>& group = holders[tile_of(dev)];  // ascending by construction
    shard.replica_id = std::find(group.begin(), group.end(), dev) - group.begin();
    out.push_back(std::move(shard));
  }
  return out;
}

at::Tensor UploadSharded(const at::Tensor& host, const Sharding& sharding) {
  std::lock_guard<GraphLock> lock(GraphMutex());
  TORCH_CHECK(host.device().is_cpu(), "UploadSharded needs a CPU tensor, got one on ",
              host.device());
  TORCH_CHECK(sharding.rank() == host.dim(), "sharding rank ", sharding.rank(),
              " does not match the tensor rank ", host.dim());
  Count("TransferToDevice");
  // A private copy: DeviceData::FromHost keeps narrowed views of its input as shards (only the
  // shard at offset 0 is copied), so shards would otherwise alias the caller's tensor and see
  // its later in-place changes.
  at::Tensor copy = host.clone(at::MemoryFormat::Contiguous);
  ir::Value value{ir::MakeDataNode(runtime::DeviceData::FromHost(copy, sharding)), 0};
  return WrapOutput(value, /*factory=*/true);
}

void LoadLocalShards(const at::Tensor& t, const std::vector<at::Tensor>& shards) {
  std::lock_guard<GraphLock> lock(GraphMutex());
  LazyImpl* impl = GetLazyImpl(t, "load_local_shards_");
  Sharding s = GetSharding(t);
  TORCH_CHECK(!IsReplicatedOrNone(s),
              "Replicated tensor should not be loaded from _load_local_shards - use copy_");
  int64_t n = runtime::DeviceSet::Get().num_devices();
  TORCH_CHECK(static_cast<int64_t>(shards.size()) == n,
              "Shards must be provided for all local devices: got ", shards.size(), ", expected ", n);
  const TensorType& type = impl->slot()->value.type();
  Shape want = s.ShardShape(type.shape);
  std::vector<runtime::BufferPtr> buffers;
  for (int64_t dev = 0; dev < n; ++dev) {
    at::Tensor shard = shards[dev];
    TORCH_CHECK(shard.sizes().vec() == want, "Input shard shape must include padding: ",
                shard.sizes(), " vs ", c10::IntArrayRef(want));
    if (runtime::Planning()) continue;  // a plan keeps shapes only
    buffers.push_back(runtime::MakeBuffer(
        dev, shard.to(runtime::ToScalarType(type.dtype)).contiguous().clone(), "loaded shard"));
  }
  auto data = runtime::Planning()
                  ? runtime::DeviceData::Planned(type, s)
                  : std::make_shared<runtime::DeviceData>(type, s, std::move(buffers));
  ir::Value loaded{ir::MakeDataNode(data), 0};
  // A write into t, which its aliases (a parameter behind its state_dict entry) must see.
  if (at::functionalization::impl::isFunctionalTensor(t))
    return CommitInPlace(t, MakeLazyTensor(loaded), impl->slot());
  SetSlotValue(impl->slot(), loaded);
}

}  // namespace spmd::aten
