// Fused attention's operands and its local lowerings, shared by its rule (rules/attention.cc)
// and its ring (rules/ring_attention.cc).
#pragma once
#include <optional>
#include <vector>

#include "partition/local_builder.h"

namespace spmd::partition {

// Where a fused attention node (forward or backward) holds its operands, and its flags.
struct AttentionNode {
  int q = -1, k = -1, v = -1, mask = -1;  // node input positions (-1: absent)
  int grad_out = -1, out = -1, lse = -1;  // the backward's
  bool backward = false;
  bool causal = false;
  int64_t L = 0, S = 0;  // query and key lengths
};
std::optional<AttentionNode> ReadAttention(const ir::Node& node, bool backward);

// The fraction of (query, key) pairs a top-left causal mask keeps over l queries and s keys.
double CausalFraction(int64_t l, int64_t s);

// The node's op on local `inputs` (one per node input, in its order) with `is_causal` and the
// mask replaced (`mask`: a local float mask [l, s] of the queries' dtype, or none), results of
// types `outs` laid out as `layouts` (globals `globals`).
std::vector<LocalValue> EmitAttention(LocalBuilder& b, const AttentionNode& a,
                                      std::vector<ir::Value> inputs, bool is_causal,
                                      const LocalValue* mask, const std::vector<TensorType>& outs,
                                      const std::vector<Sharding>& layouts,
                                      const std::vector<TensorType>& globals);

// The additive causal mask of queries at `q_rows` ([l, 1] positions) over keys at `k_cols`
// ([s]): 0 where the key's position is at most the query's, -inf elsewhere, as `dtype`.
LocalValue CausalMask(LocalBuilder& b, const LocalValue& q_rows, const LocalValue& k_cols,
                      DType dtype);

// Ring attention (rules/ring_attention.cc): the node's keys and values (and, backward, their
// gradients' running sums) passed around the ring of `ring`, on which the queries' rows are
// tiled too.
std::vector<LocalValue> LowerRingAttention(LocalBuilder& b, const AttentionNode& a,
                                           const std::vector<LocalValue>& operands,
                                           const AxisList& ring);

}  // namespace spmd::partition
