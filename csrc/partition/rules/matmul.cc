// The matmul family. mm: [i,k],[k,j] -> [i,j] with k a reduction (sharding it leaves partial
// sums; its padding is zeroed on both sides, since NaN garbage on one side cannot be masked
// by zeros on the other). bmm adds a batch factor. addmm/baddbmm broadcast their bias onto the
// result; with a sharded contraction the bias is added after the partial sums are reduced, so
// it is counted once. _scaled_mm, FP8 training's mm, tiles its scales with the rows and
// columns they scale (ScaledMatmul).
#include "partition/rules/matmul.h"

#include "partition/local_builder.h"
#include "partition/rules/all_rules.h"
#include "partition/rules/rule.h"

namespace spmd::partition {

namespace {

// addmm(bias, m1, m2, beta, alpha) = beta*bias + alpha*(m1 @ m2). With a sharded contraction
// the product is a partial sum over the contraction axes; the result stays one too: every
// member adds beta*bias/n (n = the group size), so the pending sum counts the bias once and
// the consumer decides between all-reduce and reduce-scatter. (Integer results cannot be
// split that way: they are reduced here and the bias added once.)
// beta = 0 ignores the bias entirely (NaN/inf in it must not propagate, as in ATen): the
// local op is then alpha * (m1 @ m2), also unsharded (vmap's addmm, which runs the local op
// over stacked devices, computes beta * bias and would propagate them).
std::vector<LocalValue> LowerBiasedContraction(LocalBuilder& b, const std::vector<LocalValue>& ops,
                                               int lhs, int rhs, int bias, int k) {
  const ir::Arg beta = b.node_arg(3);
  const bool no_bias = beta.is_scalar() && !beta.dynamic && beta.ScalarValue() == 0.0;
  if (b.factor_axes()[k].empty() && !no_bias) return b.EmitNodeOp(ops);
  const ir::Node& n = b.node();
  bool batched = n.output(0).rank() == 3;
  const char* mm = batched ? "aten::bmm" : "aten::mm";
  std::vector<ir::ArgSchema> mm_schema = {{"self", ir::ArgType::kTensor}, {"mat2", ir::ArgType::kTensor}};
  const Sharding& layout = b.result_layout(0);
  TensorType local{n.output(0).dtype, LocalShape(n.output(0).shape, layout)};
  LocalValue prod = b.EmitOp(mm, mm_schema, {ops[lhs].value, ops[rhs].value},
                             {ir::Arg::Tensor(0), ir::Arg::Tensor(1)}, local, layout, n.output(0));
  const bool keep_partial = IsFloatingPoint(n.output(0).dtype);
  if (!keep_partial) prod = b.Resolve(prod);
  if (no_bias) {
    return std::vector<LocalValue>{b.EmitOp(
        "aten::mul.Scalar", {{"self", ir::ArgType::kTensor}, {"other", ir::ArgType::kScalar}},
        {prod.value}, {ir::Arg::Tensor(0), b.node_arg(4)}, prod.value.type(), prod.layout,
        n.output(0))};
  }
  // add(bias * beta [/ n], prod, alpha).
  ir::Value bias_v = ops[bias].value;
  ir::Arg bias_scale = beta;
  if (keep_partial) {
    double n_members = static_cast<double>(AxesSize(b.mesh(), b.factor_axes()[k]));
    ir::Arg s = ir::Arg::ScalarDouble((beta.is_scalar() ? beta.ScalarValue() : 1.0) / n_members);
    if (beta.is_scalar() && beta.dynamic) {
      // A run-time beta: scale by 1/n here, by beta below.
      bias_v = b.EmitOp("aten::mul.Scalar", {{"self", ir::ArgType::kTensor}, {"other", ir::ArgType::kScalar}},
                        {bias_v}, {ir::Arg::Tensor(0), beta}, bias_v.type(), ops[bias].layout,
                        ops[bias].global).value;
      s.d = 1.0 / n_members;
    }
    bias_scale = s;
  }
  if (bias_scale.is_scalar() && (bias_scale.dynamic || bias_scale.ScalarValue() != 1.0)) {
    bias_v = b.EmitOp("aten::mul.Scalar", {{"self", ir::ArgType::kTensor}, {"other", ir::ArgType::kScalar}},
                      {bias_v}, {ir::Arg::Tensor(0), bias_scale}, bias_v.type(), ops[bias].layout,
                      ops[bias].global).value;
  }
  LocalValue out = b.EmitOp(
      "aten::add.Tensor",
      {{"self", ir::ArgType::kTensor}, {"other", ir::ArgType::kTensor}, {"alpha", ir::ArgType::kScalar}},
      {bias_v, prod.value}, {ir::Arg::Tensor(0), ir::Arg::Tensor(1), b.node_arg(4)}, prod.value.type(),
      prod.layout, n.output(0));
  return std::vector<LocalValue>{out};
}

// [batch..., i, k] x [batch..., k, j] -> [batch..., i, j], for operands `lhs` and `rhs`
// (positions among the node inputs); `bias` (or -1) broadcasts onto the result.
std::optional<ShardingRule> Contraction(const ir::Node& node, int lhs, int rhs, int bias) {
  const TensorType& a = node.input(lhs).type();
  const TensorType& b = node.input(rhs).type();
  const TensorType& out = node.output(0);
  if (a.rank() < 2 || a.rank() != b.rank() || out.rank() != a.rank()) return std::nullopt;
  ShardingRule rule;
  rule.executor.reads_extents = false;  // rows and columns are independent
  TensorFactors fa, fb, fo;
  for (int64_t d = 0; d + 2 < a.rank(); ++d) {
    int batch = rule.AddFactor(a.shape[d]);
    fa.push_back({batch});
    fb.push_back({batch});
    fo.push_back({batch});
  }
  int i = rule.AddFactor(a.shape[a.rank() - 2]);
  int k = rule.AddFactor(a.shape.back(), FactorKind::kReduction);
  rule.factors[k].sums = bias < 0;  // a bias is added once, not once per tile of k
  int j = rule.AddFactor(b.shape.back());
  fa.insert(fa.end(), {{i}, {k}});
  fb.insert(fb.end(), {{k}, {j}});
  fo.insert(fo.end(), {{i}, {j}});
  rule.operands.resize(node.inputs().size());
  rule.operands[lhs] = fa;
  rule.operands[rhs] = fb;
  if (bias >= 0) rule.operands[bias] = BroadcastFactors(node.input(bias).type(), out, fo);
  rule.results = {fo};
  rule.cost.flops_per_point = 2;  // a multiply and an add per (batch, i, k, j)
  if (bias < 0) return rule;
  rule.lowering.lower = [lhs, rhs, bias, k](LocalBuilder& b, const std::vector<LocalValue>& ops) {
    return LowerBiasedContraction(b, ops, lhs, rhs, bias, k);
  };
  return rule;
}

// _scaled_mm(self [i,k], mat2 [k,j], scale_a, scale_b, bias?, scale_result?, out_dtype,
// use_fast_accum) = scale_a * scale_b * (self @ mat2) [+ bias]: the FP8 matmul of Float8
// training (torchao's Float8Linear). The scales are one value per tensor (0-dim) or one per
// row of self and column of mat2 ([i,1], [1,j]), so each is tiled as the rows or columns it
// scales, and the bias as the columns. They multiply the accumulated product, which is linear
// in the contraction's terms: a sharded k leaves partial sums in the output dtype, reduced as
// mm's are. Not with a bias (it would be added once per tile) nor into an FP8 result (partial
// sums rounded to FP8 do not add up to the rounded sum): k is then gathered.
std::optional<ShardingRule> ScaledMatmul(const ir::Node& node) {
  const int lhs = InputOfArg(node, "self"), rhs = InputOfArg(node, "mat2");
  if (lhs < 0 || rhs < 0 || InputOfArg(node, "scale_a") < 0 || InputOfArg(node, "scale_b") < 0)
    return std::nullopt;
  const TensorType& a = node.input(lhs).type();
  const TensorType& b = node.input(rhs).type();
  const TensorType& out = node.output(0);
  if (a.rank() != 2 || b.rank() != 2 || out.rank() != 2) return std::nullopt;
  const bool partial_sums = InputOfArg(node, "bias") < 0 && !IsFloat8(out.dtype);
  ShardingRule rule;
  rule.executor.reads_extents = false;  // rows and columns are independent
  const int i = rule.AddFactor(a.shape[0]);
  const int k = rule.AddFactor(
      a.shape[1], partial_sums ? FactorKind::kReduction : FactorKind::kNeedReplication);
  rule.factors[k].sums = partial_sums;
  const int j = rule.AddFactor(b.shape[1]);
  const TensorFactors fo = {{i}, {j}};
  rule.operands.resize(node.inputs().size());
  rule.operands[lhs] = {{i}, {k}};
  rule.operands[rhs] = {{k}, {j}};
  for (const char* name : {"scale_a", "scale_b", "bias", "scale_result"})
    if (const int in = InputOfArg(node, name); in >= 0)
      rule.operands[in] = BroadcastFactors(node.input(in).type(), out, fo);
  rule.results = {fo};
  rule.cost.flops_per_point = 2;  // a multiply and an add per (i, k, j)
  rule.cost.compute_dtype_operand = lhs;  // at the FP8 rate, into a wider result
  return rule;
}

}  // namespace

bool RecordMatmulWhole(const Shape& a, const Shape& b) {
  if (a.size() < 3 || a.size() != b.size()) return false;
  for (size_t d = 0; d + 2 < a.size(); ++d)
    if (a[d] != b[d]) return false;
  return true;
}

void RegisterMatmulRules() {
  // aten::matmul is recorded whole only for >= 3-D operands with equal batch dims.
  RegisterRules({"aten::mm", "aten::bmm"},
                [](const ir::Node& n) { return Contraction(n, 0, 1, -1); });
  // Its batch dims broadcast from the right like a pointwise op's dims, so devices' shards
  // stacked in front form one more batch dim: one call over all devices, no vmap (which
  // folds the device dim into copies of both operands).
  RegisterRule("aten::matmul", [](const ir::Node& n) {
    std::optional<ShardingRule> rule = Contraction(n, 0, 1, -1);
    if (rule) rule->executor.elementwise = true;
    return rule;
  });
  RegisterRules({"aten::addmm", "aten::baddbmm"},
                [](const ir::Node& n) { return Contraction(n, 1, 2, 0); });
  RegisterRule("aten::_scaled_mm", ScaledMatmul);
}

}  // namespace spmd::partition
