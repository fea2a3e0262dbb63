// Fused attention: torch's CPU flash kernel, recorded as one node (aten/attention.cc picks it
// wherever CPU eager does), never the [b, h, s_q, s_kv] scores of the math decomposition.
//
//   forward:  q [b,H,l,d], k [b,Hk,s,d], v [b,Hk,s,d] (, mask) -> out [b,H,l,d], lse [b,H,l]
//   backward: grad_out, q, k, v, out, lse (, mask) -> grad_q [b,H,l,d], grad_k, grad_v [b,Hk,s,d]
//
// Batch and heads are pass-through: data parallel and tensor parallel over heads run the local
// kernel with no communication. With grouped-query attention (Hk kv heads, H = Hk * g query
// heads; query head i reads kv head i / g) the query heads dim is the compound [hk g]: sharding
// hk shards both head dims alike, g stays whole (a tile of query heads holds whole groups).
// The query length is pass-through in the forward (rows of the scores are independent) and a
// summed reduction in the backward (grad_k and grad_v add up over query rows; grad_q keeps them
// side by side); its padding then reads 0 in grad_out, q, out, lse and the mask, so a padded
// row contributes exp(0 - 0) * (0 - 0) = 0. A causal mask is relative to the global indices:
// with the queries' rows tiled, each device masks its rows by their global positions (an
// additive mask made on the device; the kernel's own mask is top-left in local indices). The
// key length and the head dim need replication: softmax normalizes over keys, q.k contracts
// the head dim inside it. Where the key length is tiled over the axes that tile the query rows
// (a sharded sequence: context parallelism), the keys and values are not gathered: they pass
// around those axes' ring (ring attention, rules/ring_attention.cc), or the axes move onto the
// kv heads by all-to-alls (Ulysses), as partition/ring.h chooses.
#include <algorithm>

#include "partition/rules/all_rules.h"
#include "partition/rules/attention.h"
#include "partition/rules/local_ops.h"
#include "partition/rules/rule.h"

namespace spmd::partition {

namespace {

// The mask's dims right-aligned onto [b, H, l, s]; a broadcast dim (size 1) gets no factor.
TensorFactors MaskFactors(const TensorType& mask, const std::vector<int64_t>& sizes,
                          const TensorFactors& dims) {
  TensorFactors tf(mask.rank());
  const int64_t offset = static_cast<int64_t>(dims.size()) - mask.rank();
  for (int64_t d = 0; d < mask.rank(); ++d)
    if (d + offset >= 0 && mask.shape[d] == sizes[d + offset]) tf[d] = dims[d + offset];
  return tf;
}

// Causal attention whose query rows are tiled and whose keys are whole: each device masks its
// rows by their global positions. The kernel then computes every (row, key) pair of its tile,
// masked or not, and the devices run in lockstep, so the step costs the full tile, 1 /
// CausalFraction of the rule's count (partition/cost.cc charges a device its share of that).
std::vector<LocalValue> LowerTiledCausal(LocalBuilder& b, const AttentionNode& a,
                                         const std::vector<LocalValue>& operands) {
  const LocalValue& q = operands[a.q];
  const int64_t rows = q.local_shape()[2];
  const LocalValue q_rows = TilePositions(b, q.layout.axes(2), rows, 0, /*column=*/true);
  const LocalValue k_cols = TilePositions(b, {}, a.S, 0, /*column=*/false);
  const LocalValue mask = CausalMask(b, q_rows, k_cols, q.value.type().dtype);
  std::vector<ir::Value> inputs;
  for (const LocalValue& v : operands) inputs.push_back(v.value);
  std::vector<TensorType> outs, globals;
  std::vector<Sharding> layouts;
  for (int o = 0; o < b.node().num_outputs(); ++o) {
    const TensorType& global = b.node().output(o);
    layouts.push_back(b.result_layout(o));
    outs.push_back(TensorType{global.dtype, LocalShape(global.shape, layouts.back())});
    globals.push_back(global);
  }
  b.BeginCostStep(1.0 / CausalFraction(a.L, a.S), 'k');
  return EmitAttention(b, a, std::move(inputs), /*is_causal=*/false, &mask, outs, layouts, globals);
}

std::optional<ShardingRule> Attention(const ir::Node& node, bool backward) {
  const std::optional<AttentionNode> read = ReadAttention(node, backward);
  if (!read) return std::nullopt;
  const AttentionNode a = *read;
  const TensorType &q = node.input(a.q).type(), &k = node.input(a.k).type(),
                   &v = node.input(a.v).type();
  if (q.rank() != 4 || k.rank() != 4 || v.shape != k.shape) return std::nullopt;
  const int64_t B = q.shape[0], H = q.shape[1], L = q.shape[2], D = q.shape[3];
  const int64_t Hk = k.shape[1], S = k.shape[2];
  if (k.shape[0] != B || k.shape[3] != D || Hk <= 0 || H % Hk != 0) return std::nullopt;
  if (a.mask >= 0 && node.input(a.mask).type().rank() != 2 && node.input(a.mask).type().rank() != 4)
    return std::nullopt;

  ShardingRule rule;
  rule.executor.reads_extents = false;  // batch, heads, unmasked rows independent
  const int b = rule.AddFactor(B);
  const int hk = rule.AddFactor(Hk);
  DimFactors heads{hk};
  if (H != Hk) heads.push_back(rule.AddFactor(H / Hk, FactorKind::kNeedReplication));
  const int l = rule.AddFactor(L, backward ? FactorKind::kReduction : FactorKind::kPassThrough);
  rule.factors[l].sums = backward;  // pad_value 0 (see above)
  const int s = rule.AddFactor(S, FactorKind::kNeedReplication);
  const int d = rule.AddFactor(D, FactorKind::kNeedReplication);
  const TensorFactors fq{{b}, heads, {l}, {d}}, fkv{{b}, {hk}, {s}, {d}}, flse{{b}, heads, {l}};

  rule.operands.resize(node.inputs().size());
  rule.operands[a.q] = fq;
  rule.operands[a.k] = fkv;
  rule.operands[a.v] = fkv;
  if (a.mask >= 0)
    rule.operands[a.mask] =
        MaskFactors(node.input(a.mask).type(), {B, H, L, S}, {{b}, heads, {l}, {s}});
  if (backward) {
    rule.operands[a.grad_out] = rule.operands[a.out] = fq;
    rule.operands[a.lse] = flse;
    rule.results = {fq, fkv, fkv};
  } else {
    rule.results = {fq, flse};
  }
  // The FLOPs of the matmuls over the space b*H*l*s*d: forward q.k^T and p.v (2 FLOPs each per
  // point); backward recomputes q.k^T and computes dv, dp, dq and dk: 5 matmuls, 2.5x the
  // forward (FlashAttention's count). Softmax and mask FLOPs (O(b*H*l*s)) are not counted.
  rule.cost.flops_per_point = (backward ? 10.0 : 4.0) * (a.causal ? CausalFraction(L, S) : 1.0);
  if (a.causal)
    rule.lowering.lower = [a, l](LocalBuilder& lb, const std::vector<LocalValue>& operands) {
      return lb.factor_axes()[l].empty() ? lb.EmitNodeOp(operands)
                                         : LowerTiledCausal(lb, a, operands);
    };
  // The ring pairs every query tile with every key tile once; a user's mask (its own tiles of
  // keys) and causal masks of unequal lengths stay on the gathered path.
  if (a.mask < 0 && (!a.causal || L == S)) {
    ShardingRule::Lowering::Ring ring;
    ring.factor = s;
    ring.paired = l;
    ring.exchange = hk;
    ring.operands = {a.k, a.v};
    ring.lower = [a](LocalBuilder& lb, const std::vector<LocalValue>& operands,
                     const AxisList& axes) { return LowerRingAttention(lb, a, operands, axes); };
    rule.lowering.ring = std::move(ring);
  }
  return rule;
}

}  // namespace

// The fraction of (query, key) pairs that the kernel's top-left causal mask keeps (query i
// reads keys 0..i): flash kernels skip the masked blocks, so causal attention costs about half
// (counted as MaxText does since 2025, here exactly: sum over i of min(i + 1, s) / (l * s)).
double CausalFraction(int64_t l, int64_t s) {
  if (l <= 0 || s <= 0) return 1.0;
  const int64_t full = std::max<int64_t>(l - s, 0);  // rows i >= s read every key
  const int64_t ramp = l - full;                      // rows 0..ramp-1 read i + 1 keys
  return (static_cast<double>(ramp) * (ramp + 1) / 2 + static_cast<double>(full) * s) /
         (static_cast<double>(l) * s);
}

std::optional<AttentionNode> ReadAttention(const ir::Node& node, bool backward) {
  AttentionNode a;
  a.backward = backward;
  a.q = InputOfArg(node, "query");
  a.k = InputOfArg(node, "key");
  a.v = InputOfArg(node, "value");
  a.mask = InputOfArg(node, "attn_mask");
  if (a.q < 0 || a.k < 0 || a.v < 0) return std::nullopt;
  if (backward) {
    a.grad_out = InputOfArg(node, "grad_out");
    a.out = InputOfArg(node, "out");
    a.lse = InputOfArg(node, "logsumexp");
    if (a.grad_out < 0 || a.out < 0 || a.lse < 0) return std::nullopt;
  }
  a.causal = BoolArg(node, ArgIndex(node, "is_causal"));
  a.L = node.input(a.q).type().shape.size() == 4 ? node.input(a.q).type().shape[2] : 0;
  a.S = node.input(a.k).type().shape.size() == 4 ? node.input(a.k).type().shape[2] : 0;
  return a;
}

void RegisterAttentionRules() {
  RegisterRule("aten::_scaled_dot_product_flash_attention_for_cpu",
               [](const ir::Node& n) { return Attention(n, false); });
  RegisterRule("aten::_scaled_dot_product_flash_attention_for_cpu_backward",
               [](const ir::Node& n) { return Attention(n, true); });
}

}  // namespace spmd::partition
