// Elementwise ops: one pass-through factor per result dim; operands broadcast onto them (a
// size-1 dim facing a larger result dim has no factor, so it stays replicated). Also factories
// and *_like ops, whose size argument becomes the local shape.
#include <cmath>

#include "partition/local_builder.h"
#include "partition/rules/all_rules.h"
#include "partition/rules/rule.h"

namespace spmd::partition {

namespace {

std::optional<ShardingRule> Pointwise(const ir::Node& node) {
  ShardingRule rule;
  rule.executor.reads_extents = false;  // each element from the elements at its index
  rule.executor.elementwise = true;
  const TensorType& out = node.output(0);
  TensorFactors result = PassThroughFactors(rule, out);
  for (int o = 0; o < node.num_outputs(); ++o) {
    const TensorType& t = node.output(o);
    // Extra results (dropout's mask, ...) share the factors when they have the same shape.
    rule.results.push_back(t.shape == out.shape ? result : BroadcastFactors(t, out, result));
  }
  for (const ir::Value& in : node.inputs())
    rule.operands.push_back(BroadcastFactors(in.type(), out, result));
  // *_like ops and fill read only the shape (and dtype) of `self`.
  const std::string& name = node.op()->name;
  bool like = name.size() > 5 && name.compare(name.size() - 5, 5, "_like") == 0;
  // In-place random fills overwrite every element: they too read only the shape.
  bool random_fill = name == "aten::bernoulli_" || name == "aten::uniform_" ||
                     name == "aten::normal_" || name == "aten::random_" ||
                     name == "aten::exponential_";
  bool scalar_p = node.inputs().size() == 1;  // bernoulli_.float (p a number), not .Tensor
  if (like || name == "aten::fill" || name == "aten::zero" || (random_fill && scalar_p)) {
    rule.shape_only_operands.assign(node.inputs().size(), false);
    rule.shape_only_operands[0] = true;
  }
  return rule;
}

// Factories and new_* ops: the output's dims are pass-through factors; the `size` argument
// (and `stride`, for empty_strided) are rewritten to the local shape.
std::optional<ShardingRule> Factory(const ir::Node& node) {
  int size_arg = ArgIndex(node, "size");
  if (size_arg < 0) return std::nullopt;
  ShardingRule rule;
  TensorFactors result = PassThroughFactors(rule, node.output(0));
  rule.results.push_back(result);
  for (const ir::Value& in : node.inputs())
    rule.operands.push_back(TensorFactors(in.type().rank()));  // new_*: self gives only options
  rule.shape_only_operands.assign(node.inputs().size(), true);
  rule.options_only_operands.assign(node.inputs().size(), true);
  rule.lowering.local_args = LocalSizeArgs(size_arg, ArgIndex(node, "stride"));
  rule.cost.flops_per_point = 0;  // fills memory, computes nothing
  return rule;
}

// Whether masked_fill's checked conversion of the constant `value` into `dtype` succeeds (it
// raises on overflow; infinities and NaN convert).
bool FillValueFits(const ir::Arg& value, DType dtype) {
  const double v = value.ScalarValue();
  if (std::isinf(v) || std::isnan(v)) return true;
  switch (dtype) {
    case DType::kFloat64: return true;
    case DType::kFloat32: return std::fabs(v) <= 3.4028234663852886e38;
    case DType::kBFloat16: return std::fabs(v) <= 3.3895313892515355e38;
    case DType::kFloat16: return std::fabs(v) <= 65504.0;
    default: return false;
  }
}

// masked_fill(self, mask, value) is where(mask, value, self) element for element, and ATen's
// where runs vectorized while masked_fill does not (docs/benchmarks.md, "Design
// measurements"). Taken only where the two agree exactly: a floating self
// (the scalar then takes self's dtype under where's type promotion), a bool mask, and a
// constant value that masked_fill's overflow check would accept (a run-time value stays
// masked_fill, which checks it).
std::optional<ShardingRule> MaskedFillScalar(const ir::Node& node) {
  std::optional<ShardingRule> rule = Pointwise(node);
  const int value_arg = ArgIndex(node, "value");
  if (!rule || value_arg < 0 || node.inputs().size() != 2) return rule;
  const ir::Arg& value = node.args()[value_arg];
  const DType dtype = node.input(0).type().dtype;
  if (!IsFloatingPoint(dtype) || node.input(1).type().dtype != DType::kBool || !value.is_scalar() ||
      value.dynamic || !FillValueFits(value, dtype))
    return rule;
  rule->lowering.lower = [value](LocalBuilder& b, const std::vector<LocalValue>& ops) {
    const LocalValue& self = ops[0];
    return std::vector<LocalValue>{b.EmitOp(
        "aten::where.ScalarSelf",
        {{"condition", ir::ArgType::kTensor}, {"self", ir::ArgType::kScalar},
         {"other", ir::ArgType::kTensor}},
        {ops[1].value, self.value}, {ir::Arg::Tensor(0), value, ir::Arg::Tensor(1)},
        self.value.type(), b.result_layout(0), b.node().output(0))};
  };
  return rule;
}

// A dtype cast is linear in its operand when it is exact (FloatCastIsExact: an upcast such as
// bf16 -> f32, or no change of type): each term of a pending sum converts without rounding, and
// the terms then add up in the result's type, at least as precisely as in the operand's (the
// same sum, not always the bitwise same result). A narrowing cast is not: the rounded terms do
// not add up to the rounded sum.
std::optional<ShardingRule> Cast(const ir::Node& node) {
  std::optional<ShardingRule> rule = Pointwise(node);
  if (rule && FloatCastIsExact(node.input(0).type().dtype, node.output(0).dtype))
    rule->algebra.linear_operands = {true};
  return rule;
}

}  // namespace

void RegisterPointwiseRules() {
  RegisterRules(
      {// arithmetic and comparison
       "aten::add", "aten::sub", "aten::div", "aten::rsub",
       "aten::remainder", "aten::fmod", "aten::pow", "aten::maximum", "aten::minimum",
       "aten::eq", "aten::ne", "aten::lt", "aten::le", "aten::gt", "aten::ge",
       "aten::logical_and", "aten::logical_or", "aten::logical_xor", "aten::logical_not",
       "aten::bitwise_and", "aten::bitwise_or", "aten::bitwise_xor", "aten::bitwise_not",
       "aten::where", "aten::masked_fill", "aten::addcmul", "aten::addcdiv", "aten::lerp",
       "aten::clamp", "aten::clamp_min", "aten::clamp_max", "aten::floor_divide",
       // unary math
       "aten::abs", "aten::sign", "aten::sgn", "aten::exp", "aten::exp2", "aten::expm1",
       "aten::log", "aten::log2", "aten::log10", "aten::log1p", "aten::sqrt", "aten::rsqrt",
       "aten::reciprocal", "aten::sin", "aten::cos", "aten::tan", "aten::asin", "aten::acos",
       "aten::atan", "aten::sinh", "aten::cosh", "aten::tanh", "aten::erf", "aten::erfc",
       "aten::erfinv", "aten::floor", "aten::ceil", "aten::round", "aten::trunc", "aten::frac",
       "aten::isnan", "aten::isinf", "aten::nan_to_num", "aten::square", "aten::atan2",
       "aten::hypot", "aten::xlogy", "aten::sigmoid", "aten::logit",
       // activations and their backward
       "aten::relu", "aten::gelu", "aten::gelu_backward", "aten::silu", "aten::silu_backward",
       "aten::threshold", "aten::threshold_backward", "aten::sigmoid_backward",
       "aten::tanh_backward", "aten::leaky_relu", "aten::leaky_relu_backward",
       "aten::hardtanh", "aten::hardtanh_backward", "aten::elu", "aten::elu_backward",
       "aten::softplus", "aten::softplus_backward", "aten::hardsigmoid",
       "aten::hardsigmoid_backward", "aten::hardswish", "aten::hardswish_backward",
       "aten::mish", "aten::mish_backward", "aten::log_sigmoid_forward",
       "aten::log_sigmoid_backward", "aten::prelu", "aten::_prelu_kernel",
       "aten::_prelu_kernel_backward",
       // casts, copies, *_like, dropout
       "aten::copy", "aten::copy_", "aten::fill",
       "aten::zero", "aten::zeros_like", "aten::ones_like", "aten::full_like",
       "aten::empty_like", "aten::rand_like", "aten::randn_like", "aten::bernoulli",
       "aten::bernoulli_", "aten::uniform_", "aten::normal_", "aten::random_",
       "aten::exponential_",
       "aten::native_dropout", "aten::native_dropout_backward", "aten::max.other",
       "aten::min.other"},
      Pointwise);
  RegisterRules({"aten::zeros", "aten::ones", "aten::full", "aten::empty", "aten::empty_strided",
                 "aten::rand", "aten::randn", "aten::new_zeros", "aten::new_ones",
                 "aten::new_full", "aten::new_empty", "aten::new_empty_strided"},
                Factory);
  // Pointwise too, with more said about them. Linear in their tensor operand(s), the others
  // fixed: pending partial sums pass through.
  // (mul is linear in either factor; div in its numerator.)
  RegisterRules({"aten::neg", "aten::clone", "aten::mul"}, LinearIn(Pointwise, {-1}));
  // Views of their operand in the program the user wrote (the functional IR copies them).
  RegisterRules({"aten::detach_copy", "aten::alias_copy", "aten::lift_fresh_copy", "aten::lift_fresh"},
                AsView(LinearIn(Pointwise, {-1}), ViewKind::kReshape));
  RegisterRule("aten::add.Tensor",
               WithForm(Additive(Pointwise), ShardingRule::Algebra::Form::kSum));
  RegisterRule("aten::sub.Tensor", Additive(Pointwise));
  RegisterRule("aten::div.Tensor", LinearIn(Pointwise, {0}));
  RegisterRule("aten::div.Scalar", LinearIn(Pointwise, {0}));
  RegisterRule("aten::masked_fill.Scalar", MaskedFillScalar);
  RegisterRule("aten::_to_copy", Cast);
}

}  // namespace spmd::partition
