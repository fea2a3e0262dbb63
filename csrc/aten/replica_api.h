// Recording the xm:: cross-replica collectives (ir/replica_ops.h) on spmd tensors: the C++ side
// of xm.all_reduce / all_gather / reduce_scatter / all_to_all in multi-process mode. Nothing
// runs here; the collectives execute with the rest of the graph at the next sync.
#pragma once
#include <ATen/Tensor.h>

#include <vector>

#include "sharding/sharding.h"

namespace spmd::aten {

using ReplicaGroups = std::vector<std::vector<int64_t>>;  // replica ordinals, in member order

// One result per input (a single coalesced collective). Dims may be negative.
std::vector<at::Tensor> ReplicaAllReduce(const std::vector<at::Tensor>& inputs, ReduceOp op,
                                         double scale, const ReplicaGroups& groups);
at::Tensor ReplicaAllGather(const at::Tensor& t, int64_t dim, const ReplicaGroups& groups);
at::Tensor ReplicaReduceScatter(const at::Tensor& t, ReduceOp op, double scale, int64_t dim,
                                const ReplicaGroups& groups);
at::Tensor ReplicaAllToAll(const at::Tensor& t, int64_t split_dim, int64_t concat_dim,
                           const ReplicaGroups& groups);

// Makes `dst` hold `src`'s value, as an in-place op would: through functionalization (so views
// and aliases of `dst` see the update) and with a version bump (so autograd notices). The
// in-place forms (all_reduce of a list, output=) use it.
void AssignValue(const at::Tensor& dst, const at::Tensor& src);

}  // namespace spmd::aten
