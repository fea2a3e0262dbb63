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

// arange(start, end, step) as int64, replicated.
LocalValue Range(LocalBuilder& b, int64_t start, int64_t end, int64_t step);
// Entry (i + shift) mod k of the table first + m * step (m < k), on member i of the k of the
// group over `axes`: [1] int64 (first where `axes` tile nothing). With step the tile of a dim
// tiled over `axes`, the global position of that tile's first row.
LocalValue TileTable(LocalBuilder& b, const AxisList& axes, int64_t first, int64_t step,
                     int64_t shift);
// The global positions of the rows of tile (i + shift) mod k of a dim tiled over `axes` in
// tiles of `tile`: [tile] int64 (`column`: [tile, 1]).
LocalValue TilePositions(LocalBuilder& b, const AxisList& axes, int64_t tile, int64_t shift,
                         bool column);
// x with a trailing dim of 1 (aten::unsqueeze_copy).
LocalValue Unsqueezed(LocalBuilder& b, const LocalValue& x);
// x >= y, broadcast (bool).
LocalValue AtLeast(LocalBuilder& b, const LocalValue& x, const LocalValue& y);
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
