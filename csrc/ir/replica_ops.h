// The xm:: ops: explicit cross-replica collectives that user code records with xm.all_reduce,
// xm.all_gather, xm.reduce_scatter and xm.all_to_all in multi-process mode (one process per
// replica, PyTorch/XLA's xmp.spawn). Unlike the partitioner's spmd:: collectives (groups over
// mesh axes of one process's device set), their groups are lists of replica ordinals (process
// ranks), exactly PyTorch/XLA's `groups=[[0, 1], [2, 3]]`, so they get ops of their own.
//
// Each node's shapes are per replica (the graph a process records is its own replica's). Every
// replica of the world is in exactly one group, and all groups have one size k:
//
//   xm::all_reduce(inputs[]; op, scale, groups, group_size)
//        one result per input, same shape: op-reduction over the group, times `scale`.
//        Several inputs form one coalesced collective (as PyTorch/XLA's list form).
//   xm::all_gather(self; dim, groups, group_size)
//        the members' inputs concatenated on `dim` in group order: extent * k.
//   xm::reduce_scatter(self; op, scale, dim, groups, group_size)
//        reduce over the group, times `scale`; member i keeps chunk i of `dim` (extent / k).
//   xm::all_to_all(self; split_dim, concat_dim, groups, group_size)
//        member j receives chunk j (of k, on split_dim) of every member's input, concatenated
//        on concat_dim in group order: split extent / k, concat extent * k (same dim allowed).
//
// `groups` is flattened group by group into one int list; `group_size` cuts it back.
#pragma once
#include <cstdint>
#include <vector>

#include "core/shape.h"
#include "ir/arg.h"
#include "ir/op.h"
#include "sharding/sharding.h"

namespace spmd::ir {

struct ReplicaOps {
  const OpInfo* all_reduce;
  const OpInfo* all_gather;
  const OpInfo* reduce_scatter;
  const OpInfo* all_to_all;
  static const ReplicaOps& Get();
  bool Contains(const OpInfo* op) const;
};

struct ReplicaAttrs {
  ReduceOp op = ReduceOp::kSum;
  double scale = 1.0;
  int64_t dim = -1;
  int64_t split_dim = -1;
  int64_t concat_dim = -1;
  std::vector<std::vector<int64_t>> groups;  // replica ordinals, in member order

  int64_t group_size() const { return groups.empty() ? 0 : groups[0].size(); }
  int64_t world_size() const { return static_cast<int64_t>(groups.size()) * group_size(); }

  // Throws std::invalid_argument for a malformed attribute or groups that are not a partition
  // of 0..W-1 into equal-sized lists.
  static ReplicaAttrs Read(const OpInfo& op, const std::vector<Arg>& args);
};

// The (groups, group_size) args for `groups`, validated as Read would.
std::vector<Arg> GroupArgs(const std::vector<std::vector<int64_t>>& groups);

// The per-replica result shape of `op` for a per-replica input of shape `input`. Throws
// std::invalid_argument for a dim out of range or an extent that does not split k ways.
Shape ReplicaOutputShape(const OpInfo& op, const Shape& input, const ReplicaAttrs& attrs);

}  // namespace spmd::ir
