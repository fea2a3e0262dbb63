#include "runtime/collectives.h"

#include <mutex>

#include "core/error.h"
#include "core/metrics.h"
#include "runtime/in_process_collectives.h"

namespace spmd::runtime {

namespace {

std::mutex& CurrentMutex() {
  static auto* mu = new std::mutex();
  return *mu;
}
std::shared_ptr<Collectives>& CurrentSlot() {
  static auto* slot = new std::shared_ptr<Collectives>();
  return *slot;
}
std::shared_ptr<Collectives>& ReplicasSlot() {
  static auto* slot = new std::shared_ptr<Collectives>();
  return *slot;
}

}  // namespace

void RecordCollective(CollectiveKind kind, const at::Tensor& shard) {
  const std::string name = CollectiveMetricName(kind);
  Count(name);
  Metrics::Get().Record(name + "Bytes",
                        static_cast<double>(shard.numel() * static_cast<int64_t>(shard.element_size())));
}

void CheckCollectiveDim(const char* op, const char* what, int64_t dim, const at::Tensor& shard) {
  SPMD_CHECK_VALUE(dim >= 0 && dim < shard.dim(), op, ": ", what, " ", dim,
                   " is out of range for a tensor of rank ", shard.dim());
}

void CheckCollectiveExtent(const char* op, const char* what, const at::Tensor& shard, int64_t dim,
                           int64_t want) {
  SPMD_CHECK_VALUE(shard.size(dim) == want, op, ": each device's input must have extent ", want,
                   " on ", what, " ", dim, ", got shape ", shard.sizes());
}

const char* CollectiveMetricName(CollectiveKind kind) {
  switch (kind) {
    case CollectiveKind::kAllGather: return "CollectiveAllGather";
    case CollectiveKind::kAllReduce: return "CollectiveAllReduce";
    case CollectiveKind::kReduceScatter: return "CollectiveReduceScatter";
    case CollectiveKind::kAllToAll: return "CollectiveAllToAll";
    case CollectiveKind::kPermute: return "CollectivePermute";
  }
  SPMD_FAIL("unknown CollectiveKind ", static_cast<int>(kind));
}

std::shared_ptr<Collectives> Collectives::Current() {
  std::lock_guard<std::mutex> lock(CurrentMutex());
  if (!CurrentSlot()) CurrentSlot() = std::make_shared<InProcessCollectives>();
  return CurrentSlot();
}

void Collectives::SetCurrent(std::shared_ptr<Collectives> collectives) {
  std::lock_guard<std::mutex> lock(CurrentMutex());
  CurrentSlot() = std::move(collectives);
}

std::shared_ptr<Collectives> Collectives::Replicas() {
  {
    std::lock_guard<std::mutex> lock(CurrentMutex());
    if (ReplicasSlot()) return ReplicasSlot();
  }
  return Current();
}

void Collectives::SetReplicas(std::shared_ptr<Collectives> collectives) {
  std::lock_guard<std::mutex> lock(CurrentMutex());
  ReplicasSlot() = std::move(collectives);
}

const at::Tensor& Collectives::CheckInputs(const char* op, const DeviceTensors& in,
                                           const MeshGroups& groups) const {
  const at::Tensor* first = nullptr;
  for (const auto& group : groups.groups()) {
    for (int64_t d : group) {
      SPMD_CHECK_VALUE(d < static_cast<int64_t>(in.size()), op, ": no input slot for device ", d,
                       " (", in.size(), " given)");
      if (!IsLocal(d)) continue;
      const at::Tensor& t = in[d];
      SPMD_CHECK_VALUE(t.defined(), op, ": missing the input of local device ", d);
      if (!first) {
        first = &t;
        continue;
      }
      SPMD_CHECK_VALUE(t.sizes() == first->sizes() && t.scalar_type() == first->scalar_type(),
                       op, ": every device's input must have one shape and dtype, got ",
                       first->sizes(), " ", first->scalar_type(), " and ", t.sizes(), " ",
                       t.scalar_type(), " (device ", d, ")");
    }
  }
  for (size_t d = 0; d < in.size(); ++d)
    SPMD_CHECK_VALUE(!in[d].defined() || groups.Contains(d), op, ": device ", d,
                     " has an input but is not in the mesh");
  SPMD_CHECK_VALUE(first != nullptr, op, ": this process owns no device of the mesh");
  return *first;
}

DeviceTensors Collectives::AllGather(const DeviceTensors& in, const MeshGroups& groups,
                                     int64_t dim, int64_t size) {
  const at::Tensor& x = CheckInputs("all_gather", in, groups);
  CheckCollectiveDim("all_gather", "dim", dim, x);
  CheckCollectiveExtent("all_gather", "dim", x, dim, DimTiling(size, groups.group_size()).tile_size);
  RecordCollective(CollectiveKind::kAllGather, x);
  return DoAllGather(in, groups, dim, size);
}

DeviceTensors Collectives::AllReduce(const DeviceTensors& in, const MeshGroups& groups,
                                     ReduceOp op) {
  const at::Tensor& x = CheckInputs("all_reduce", in, groups);
  RecordCollective(CollectiveKind::kAllReduce, x);
  return DoAllReduce(in, groups, op);
}

DeviceTensors Collectives::ReduceScatter(const DeviceTensors& in, const MeshGroups& groups,
                                         int64_t dim, ReduceOp op, int64_t size) {
  const at::Tensor& x = CheckInputs("reduce_scatter", in, groups);
  CheckCollectiveDim("reduce_scatter", "dim", dim, x);
  CheckCollectiveExtent("reduce_scatter", "dim", x, dim, size);
  RecordCollective(CollectiveKind::kReduceScatter, x);
  return DoReduceScatter(in, groups, dim, op, size);
}

DeviceTensors Collectives::AllToAll(const DeviceTensors& in, const MeshGroups& groups,
                                    int64_t split_dim, int64_t concat_dim, int64_t split_size,
                                    int64_t concat_size) {
  const at::Tensor& x = CheckInputs("all_to_all", in, groups);
  CheckCollectiveDim("all_to_all", "split_dim", split_dim, x);
  CheckCollectiveDim("all_to_all", "concat_dim", concat_dim, x);
  SPMD_CHECK_VALUE(split_dim != concat_dim, "all_to_all: split_dim and concat_dim must differ");
  CheckCollectiveExtent("all_to_all", "split_dim", x, split_dim, split_size);
  CheckCollectiveExtent("all_to_all", "concat_dim", x, concat_dim,
              DimTiling(concat_size, groups.group_size()).tile_size);
  RecordCollective(CollectiveKind::kAllToAll, x);
  return DoAllToAll(in, groups, split_dim, concat_dim, split_size, concat_size);
}

DeviceTensors Collectives::CollectivePermute(const DeviceTensors& in, const MeshGroups& groups,
                                             const PermutePairs& pairs) {
  const at::Tensor& x = CheckInputs("collective_permute", in, groups);
  const int64_t k = groups.group_size();
  std::vector<bool> receives(k, false);
  for (const auto& [src, dst] : pairs) {
    SPMD_CHECK_VALUE(src >= 0 && src < k && dst >= 0 && dst < k,
                     "collective_permute: pair (", src, ", ", dst,
                     ") is out of range for groups of ", k);
    SPMD_CHECK_VALUE(!receives[dst], "collective_permute: member ", dst,
                     " receives from more than one source");
    receives[dst] = true;
  }
  RecordCollective(CollectiveKind::kPermute, x);
  return DoCollectivePermute(in, groups, pairs);
}

}  // namespace spmd::runtime
