// XLA's windowed einsum (JAX's collective matmul, torchtitan's async tensor parallelism): a
// contraction whose operand must first be all-gathered over a group of n devices, or whose
// partial result must then be reduce-scattered over one, runs instead as n partial
// contractions interleaved with n - 1 collective-permutes around the group's ring, so that
// each transfer overlaps a partial product (the step-time model prices that: each step is an
// op of its own, plan/step_schedule.h). The values equal the gathered-then-multiplied
// (multiplied-then-scattered) ones up to the order of the partial sums.
//
// For member i of a group over mesh axes G (n members, ring order = member order):
// - all-gather of operand A on a contracted dim: A's chunk j meets B's rows of chunk j:
//     a_0 = A_i, a_t = permute(a_{t-1}) (member m receives from m + 1) = A_{(i+t) mod n};
//     out = sum_t a_t @ ring_slice(B, shift t)
// - all-gather of A on a dim of the result (M or N): a_t @ B is the result's chunk
//     (i + t) mod n: out = ring_unroll(cat_t(a_t @ B))
// - reduce-scatter of the result onto one of its dims (M or N; the contraction tiled over
//   G): step t computes this member's part of chunk c_t = (i + n - 1 - t) mod n and adds it
//   to what member i - 1 passed on: acc_0 = X_{c_0} @ Y, acc_t = permute(acc_{t-1})
//   (member m receives from m - 1) + X_{c_t} @ Y, with X the operand holding that dim
//   (ring_slice, shift n - 1 - t); after n steps acc is member i's tile of the sum.
// The accumulating adds are the matmuls' output fusion on TPUs (no HBM traffic of their
// own); a reduce-scatter's add waits for its permute, its matmul does not.
//
// Only contractions the partitioner lowers as one local op of the node's own op (mm, bmm,
// matmul: two matrix operands, no bias), whose windowed dim is made of one factor and splits
// evenly over the group's tiles, whose collective moves at least the threshold, whose steps
// keep a windowed extent of at least `min_step_extent` (a matrix unit's tile: thinner partial
// products waste the units, as windowing an FSDP gradient over 256 chips would), and whose
// gathered operand is not a weight: a value made of device data by pointwise ops and views
// alone (a parameter, cast) waits for no compute, and its gather is issued ahead of its
// readers instead (FSDP's prefetch; XLA's scheduler).
//
// Both directions of the ring's links carry chunks at once (permutes toward the previous and
// the next member, CollectiveStat::channel), as a bidirectional ring collective does, so the
// loop moves its bytes as fast as the all-gather or reduce-scatter it replaces.
#pragma once
#include <optional>
#include <vector>

#include "partition/factor_assignment.h"
#include "partition/local_builder.h"

namespace spmd::partition {

struct WindowedEinsum {
  enum class Kind { kGatherOperand, kScatterResult };
  Kind kind = Kind::kGatherOperand;
  int operand = -1;     // the gathered operand, or the one holding the scattered result dim
  int other = -1;       // the other matrix operand
  int operand_dim = -1;  // the windowed dim of `operand`
  int other_dim = -1;    // of `other`, when the contracted factor is gathered (else -1)
  int result_dim = -1;   // of the result, when the windowed factor is one of its dims
  AxisList axes;         // G
  char gemm_extent = 'k';  // the GEMM extent each step has 1/n of: 'm', 'n' or 'k'
};

struct WindowedEinsumOptions {
  int64_t threshold_bytes = -1;  // the least bytes per device the collective moves; -1: off
  int64_t min_step_extent = 128;
  bool weight_operand = false;   // the operand considered for a gather is a weight (above)
};

// Whether contraction node `n` (rule `rule`) can all-gather operand `i` from `have` to `want`
// as a windowed einsum instead: the reshard is exactly an all-gather over trailing axes of one
// dim.
std::optional<WindowedEinsum> PlanWindowedGather(const ir::Node& n, const ShardingRule& rule,
                                                 const Mesh& mesh, int i, const Sharding& have,
                                                 const Sharding& want,
                                                 const WindowedEinsumOptions& options);
// Whether its partial result (laid out as `partial`) can be reduce-scattered onto `wanted`
// (the propagated sharding of the result) as a windowed einsum: `wanted` adds exactly the
// pending axes to one dim.
std::optional<WindowedEinsum> PlanWindowedScatter(const ir::Node& n, const ShardingRule& rule,
                                                  const Mesh& mesh, const Sharding& partial,
                                                  const Sharding& wanted,
                                                  const WindowedEinsumOptions& options);

// The loop, on `operands` in the layouts the plan expects (the gathered operand as it is);
// `result_layout` is the op's result layout (partial for a scatter). Marks each step for the
// partitioner's cost (LocalBuilder::BeginCostStep).
std::vector<LocalValue> LowerWindowedEinsum(LocalBuilder& b, const WindowedEinsum& w,
                                            const std::vector<LocalValue>& operands,
                                            const Sharding& result_layout);

}  // namespace spmd::partition
