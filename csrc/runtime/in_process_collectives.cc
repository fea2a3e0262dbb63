#include "runtime/in_process_collectives.h"

#include <ATen/ATen.h>

#include "runtime/tile_ops.h"

namespace spmd::runtime {

namespace {

// The elementwise reduction of a group's inputs (a group of one reduces to its own input:
// values are immutable, so sharing it is safe).
at::Tensor ReduceGroup(const DeviceTensors& in, const std::vector<int64_t>& group, ReduceOp op) {
  if (group.size() == 1) return in[group[0]];
  at::Tensor acc = in[group[0]].clone(at::MemoryFormat::Contiguous);
  for (size_t i = 1; i < group.size(); ++i) ReduceInto(acc, in[group[i]], op);
  return acc;
}

}  // namespace

DeviceTensors InProcessCollectives::DoAllGather(const DeviceTensors& in, const MeshGroups& groups,
                                                int64_t dim, int64_t size) {
  DeviceTensors out(in.size());
  const DimTiling tiling(size, groups.group_size());
  for (const auto& group : groups.groups()) {
    std::vector<at::Tensor> parts;
    for (size_t i = 0; i < group.size(); ++i)
      parts.push_back(ValidRows(in[group[i]], dim, tiling, i));
    at::Tensor gathered = at::cat(parts, dim);
    for (int64_t d : group) out[d] = gathered;
  }
  return out;
}

DeviceTensors InProcessCollectives::DoAllReduce(const DeviceTensors& in, const MeshGroups& groups,
                                                ReduceOp op) {
  DeviceTensors out(in.size());
  for (const auto& group : groups.groups()) {
    at::Tensor reduced = ReduceGroup(in, group, op);
    for (int64_t d : group) out[d] = reduced;
  }
  return out;
}

DeviceTensors InProcessCollectives::DoReduceScatter(const DeviceTensors& in,
                                                    const MeshGroups& groups, int64_t dim,
                                                    ReduceOp op, int64_t size) {
  DeviceTensors out(in.size());
  const DimTiling tiling(size, groups.group_size());
  for (const auto& group : groups.groups()) {
    at::Tensor reduced = ReduceGroup(in, group, op);
    for (size_t i = 0; i < group.size(); ++i) out[group[i]] = PaddedTile(reduced, dim, tiling, i);
  }
  return out;
}

DeviceTensors InProcessCollectives::DoAllToAll(const DeviceTensors& in, const MeshGroups& groups,
                                               int64_t split_dim, int64_t concat_dim,
                                               int64_t split_size, int64_t concat_size) {
  DeviceTensors out(in.size());
  const int64_t k = groups.group_size();
  const DimTiling split(split_size, k), concat(concat_size, k);
  for (const auto& group : groups.groups()) {
    for (int64_t j = 0; j < k; ++j) {
      // Member j collects tile j of the split dim from every member i's concat tile.
      std::vector<at::Tensor> parts;
      for (int64_t i = 0; i < k; ++i) {
        at::Tensor from_i = ValidRows(in[group[i]], concat_dim, concat, i);
        parts.push_back(TileOf(from_i, split_dim, split, j));
      }
      out[group[j]] = PadTo(at::cat(parts, concat_dim), split_dim, split.tile_size);
    }
  }
  return out;
}

DeviceTensors InProcessCollectives::DoCollectivePermute(const DeviceTensors& in,
                                                        const MeshGroups& groups,
                                                        const PermutePairs& pairs) {
  DeviceTensors out(in.size());
  at::Tensor zeros;  // one zero tensor shared by every member that receives nothing
  for (const auto& group : groups.groups()) {
    // Receiving is sharing: values are immutable, so the destination holds the source's tensor.
    for (const auto& [src, dst] : pairs) out[group[dst]] = in[group[src]];
    for (int64_t d : group) {
      if (out[d].defined()) continue;
      if (!zeros.defined()) zeros = at::zeros_like(in[d], at::MemoryFormat::Contiguous);
      out[d] = zeros;
    }
  }
  return out;
}

}  // namespace spmd::runtime
