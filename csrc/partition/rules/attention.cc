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
// row contributes exp(0 - 0) * (0 - 0) = 0. A causal mask is relative to the local indices, so
// causal attention keeps the query length whole. The key length and the head dim need
// replication: softmax normalizes over keys (no ring attention), q.k contracts the head dim
// inside it.
#include <algorithm>

#include "partition/rules/all_rules.h"
#include "partition/rules/rule.h"

namespace spmd::partition {

namespace {

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

// The mask's dims right-aligned onto [b, H, l, s]; a broadcast dim (size 1) gets no factor.
TensorFactors MaskFactors(const TensorType& mask, const std::vector<int64_t>& sizes,
                          const TensorFactors& dims) {
  TensorFactors tf(mask.rank());
  const int64_t offset = static_cast<int64_t>(dims.size()) - mask.rank();
  for (int64_t d = 0; d < mask.rank(); ++d)
    if (d + offset >= 0 && mask.shape[d] == sizes[d + offset]) tf[d] = dims[d + offset];
  return tf;
}

std::optional<ShardingRule> Attention(const ir::Node& node, bool backward) {
  const int qi = InputOfArg(node, "query"), ki = InputOfArg(node, "key"),
            vi = InputOfArg(node, "value"), mi = InputOfArg(node, "attn_mask");
  if (qi < 0 || ki < 0 || vi < 0) return std::nullopt;
  const TensorType &q = node.input(qi).type(), &k = node.input(ki).type(),
                   &v = node.input(vi).type();
  if (q.rank() != 4 || k.rank() != 4 || v.shape != k.shape) return std::nullopt;
  const int64_t B = q.shape[0], H = q.shape[1], L = q.shape[2], D = q.shape[3];
  const int64_t Hk = k.shape[1], S = k.shape[2];
  if (k.shape[0] != B || k.shape[3] != D || Hk <= 0 || H % Hk != 0) return std::nullopt;
  if (mi >= 0 && node.input(mi).type().rank() != 2 && node.input(mi).type().rank() != 4)
    return std::nullopt;
  const bool causal = BoolArg(node, ArgIndex(node, "is_causal"));

  ShardingRule rule;
  rule.executor.reads_extents = false;  // batch, heads, unmasked rows independent
  const int b = rule.AddFactor(B);
  const int hk = rule.AddFactor(Hk);
  DimFactors heads{hk};
  if (H != Hk) heads.push_back(rule.AddFactor(H / Hk, FactorKind::kNeedReplication));
  const FactorKind rows = causal     ? FactorKind::kNeedReplication
                          : backward ? FactorKind::kReduction
                                     : FactorKind::kPassThrough;
  const int l = rule.AddFactor(L, rows);
  rule.factors[l].sums = rows == FactorKind::kReduction;  // pad_value 0 (see above)
  const int s = rule.AddFactor(S, FactorKind::kNeedReplication);
  const int d = rule.AddFactor(D, FactorKind::kNeedReplication);
  const TensorFactors fq{{b}, heads, {l}, {d}}, fkv{{b}, {hk}, {s}, {d}}, flse{{b}, heads, {l}};

  rule.operands.resize(node.inputs().size());
  rule.operands[qi] = fq;
  rule.operands[ki] = fkv;
  rule.operands[vi] = fkv;
  if (mi >= 0)
    rule.operands[mi] = MaskFactors(node.input(mi).type(), {B, H, L, S}, {{b}, heads, {l}, {s}});
  if (backward) {
    const int gi = InputOfArg(node, "grad_out"), oi = InputOfArg(node, "out"),
              li = InputOfArg(node, "logsumexp");
    if (gi < 0 || oi < 0 || li < 0) return std::nullopt;
    rule.operands[gi] = rule.operands[oi] = fq;
    rule.operands[li] = flse;
    rule.results = {fq, fkv, fkv};
  } else {
    rule.results = {fq, flse};
  }
  // The FLOPs of the matmuls over the space b*H*l*s*d: forward q.k^T and p.v (2 FLOPs each per
  // point); backward recomputes q.k^T and computes dv, dp, dq and dk: 5 matmuls, 2.5x the
  // forward (FlashAttention's count). Softmax and mask FLOPs (O(b*H*l*s)) are not counted.
  rule.cost.flops_per_point = (backward ? 10.0 : 4.0) * (causal ? CausalFraction(L, S) : 1.0);
  return rule;
}

}  // namespace

void RegisterAttentionRules() {
  RegisterRule("aten::_scaled_dot_product_flash_attention_for_cpu",
               [](const ir::Node& n) { return Attention(n, false); });
  RegisterRule("aten::_scaled_dot_product_flash_attention_for_cpu_backward",
               [](const ir::Node& n) { return Attention(n, true); });
}

}  // namespace spmd::partition
