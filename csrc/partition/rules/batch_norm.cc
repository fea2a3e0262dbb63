// Batch norm. Channels (dim 1) pass through. In eval mode the op is elementwise per channel,
// so batch and space pass through too (and are summed into the backward's weight and bias
// gradients). In training mode the statistics span batch and space: sharding those dims makes
// this a synchronized batch norm, lowered here to local sums and small all-reduces of
// per-channel vectors, instead of gathering the activations:
//
//   forward:  mean = allreduce(sum x) / M;  var = allreduce(sum (x - mean)^2) / M  (two passes,
//             as the CPU kernel); out = eval-mode batch_norm(x, mean, var); running stats
//             updated with the unbiased variance var * M / (M - 1)
//   backward: [sum g, sum g*xhat] = allreduce(...) (one collective for both);
//             grad_input = (g - sum g / M - xhat * sum g*xhat / M) * invstd * weight;
//             grad_weight = sum g*xhat, grad_bias = sum g
//
// M is the global number of elements per channel. Padding of uneven shards is zero-masked
// (the batch and space factors are reductions), and deviations are re-masked before squaring.
#include <algorithm>

#include "partition/local_builder.h"
#include "partition/rules/all_rules.h"
#include "partition/rules/rule.h"

namespace spmd::partition {

namespace {

using ir::Arg;
using ir::ArgSchema;
using ir::ArgType;

ArgSchema T(const char* name) { return {name, ArgType::kTensor}; }
ArgSchema S(const char* name) { return {name, ArgType::kScalar}; }

// Small builders for the per-device ops of the lowering: each emits one ATen op on local
// values whose layout the caller knows.
class Ops {
 public:
  Ops(LocalBuilder& b, const Sharding& channels, int64_t channels_global)
      : b_(b), channels_(channels), vector_global_{DType::kFloat32, {channels_global}} {}

  // sum over `dims` -> per-channel vector, partial over the sharded axes of those dims.
  LocalValue SumToChannels(const LocalValue& x, const std::vector<int64_t>& dims,
                           const Sharding& partial) {
    TensorType out{x.value.type().dtype, {x.value.type().shape[1]}};
    TensorType global{x.global.dtype, {x.global.shape[1]}};
    return b_.EmitOp("aten::sum.dim_IntList",
                     {T("self"), {"dim", ArgType::kIntList}, {"keepdim", ArgType::kBool},
                      {"dtype", ArgType::kScalarType, true}},
                     {x.value}, {Arg::Tensor(0), Arg::IntList(dims), Arg::Bool(false), Arg::None()},
                     out, partial, global);
  }
  LocalValue Mul(const LocalValue& a, const LocalValue& c, const LocalValue& like) {
    return b_.EmitOp("aten::mul.Tensor", {T("self"), T("other")}, {a.value, c.value},
                     {Arg::Tensor(0), Arg::Tensor(1)}, like.value.type(), like.layout, like.global);
  }
  LocalValue Sub(const LocalValue& a, const LocalValue& c, const LocalValue& like) {
    return b_.EmitOp("aten::sub.Tensor", {T("self"), T("other"), S("alpha")}, {a.value, c.value},
                     {Arg::Tensor(0), Arg::Tensor(1), Arg::ScalarInt(1)}, like.value.type(), like.layout,
                     like.global);
  }
  // a + alpha * c
  LocalValue AddScaled(const LocalValue& a, const LocalValue& c, double alpha) {
    return b_.EmitOp("aten::add.Tensor", {T("self"), T("other"), S("alpha")}, {a.value, c.value},
                     {Arg::Tensor(0), Arg::Tensor(1), Arg::ScalarDouble(alpha)}, a.value.type(), a.layout,
                     a.global);
  }
  LocalValue Scale(const LocalValue& a, double factor) { return b_.Scale(a, factor); }

  LocalValue AddScalar(const LocalValue& a, double v) {
    return b_.EmitOp("aten::add.Scalar", {T("self"), S("other"), S("alpha")}, {a.value},
                     {Arg::Tensor(0), Arg::ScalarDouble(v), Arg::ScalarInt(1)}, a.value.type(),
                     a.layout, a.global);
  }
  LocalValue Rsqrt(const LocalValue& a) {
    return b_.EmitOp("aten::rsqrt", {T("self")}, {a.value}, {Arg::Tensor(0)}, a.value.type(),
                     a.layout, a.global);
  }
  // A per-channel vector viewed as [1, C, 1, ...] to broadcast against an activation.
  LocalValue AsBroadcast(const LocalValue& v, const LocalValue& activation) {
    Shape local(activation.value.type().rank(), 1), global(activation.global.rank(), 1);
    local[1] = v.value.type().shape[0];
    global[1] = v.global.shape[0];
    std::vector<AxisList> dims(local.size());
    dims[1] = v.layout.axes(0);
    Sharding layout = Sharding::Tiled(v.layout.mesh_ptr(), dims);
    return b_.EmitOp("aten::view_copy", {T("self"), {"size", ArgType::kIntList}}, {v.value},
                     {Arg::Tensor(0), Arg::IntList(local)}, {v.value.type().dtype, local}, layout,
                     {v.global.dtype, global});
  }
  // Two per-channel vectors reduced with one all-reduce: stacked, resolved, split.
  std::pair<LocalValue, LocalValue> ResolveBoth(const LocalValue& a, const LocalValue& c) {
    TensorType local{a.value.type().dtype, {2, a.value.type().shape[0]}};
    TensorType global{a.global.dtype, {2, a.global.shape[0]}};
    Sharding partial = Sharding::Tiled(a.layout.mesh_ptr(), {{}, a.layout.axes(0)})
                           .WithPartial(a.layout.partial_axes(), ReduceOp::kSum);
    Arg list;
    list.kind = Arg::Kind::kTensorList;
    list.ints = {0, 1};
    LocalValue stacked = b_.EmitOp("aten::stack", {{"tensors", ArgType::kTensorList}, {"dim", ArgType::kInt}},
                                   {a.value, c.value}, {list, Arg::Int(0)}, local, partial, global);
    LocalValue both = b_.Resolve(stacked);
    auto pick = [&](int64_t i) {
      return b_.EmitOp("aten::select_copy.int",
                       {T("self"), {"dim", ArgType::kInt}, {"index", ArgType::kInt}}, {both.value},
                       {Arg::Tensor(0), Arg::Int(0), Arg::Int(i)}, a.value.type(),
                       a.layout.WithoutPartial(), a.global);
    };
    return {pick(0), pick(1)};
  }

 private:
  LocalBuilder& b_;
  Sharding channels_;
  TensorType vector_global_;
};

// Whether the lowering must synchronize statistics: some batch/space factor is sharded.
bool StatsSharded(const LocalBuilder& b, const std::vector<int>& stat_factors) {
  for (int f : stat_factors)
    if (!b.factor_axes()[f].empty()) return true;
  return false;
}

std::vector<int64_t> StatDims(int64_t rank) {
  std::vector<int64_t> dims{0};
  for (int64_t d = 2; d < rank; ++d) dims.push_back(d);
  return dims;
}

AxisList StatAxes(const LocalBuilder& b, const std::vector<int>& stat_factors) {
  AxisList axes;
  for (int f : stat_factors)
    for (int a : b.factor_axes()[f]) axes.push_back(a);
  std::sort(axes.begin(), axes.end());
  return axes;
}

std::vector<LocalValue> SyncForward(LocalBuilder& b, const std::vector<LocalValue>& operands,
                                    const std::vector<int>& stat_factors, int channel) {
  const ir::Node& n = b.node();
  const LocalValue& x = operands[InputOfArg(n, "input")];
  auto optional = [&](const char* name) -> const LocalValue* {
    int i = InputOfArg(n, name);
    return i < 0 ? nullptr : &operands[i];
  };
  const LocalValue* running_mean = optional("running_mean");
  const LocalValue* running_var = optional("running_var");
  double momentum = n.arg(ArgIndex(n, "momentum")).d;
  double eps = n.arg(ArgIndex(n, "eps")).d;
  int64_t m = NumElements(x.global.shape) / x.global.shape[1];
  std::vector<int64_t> dims = StatDims(x.global.rank());
  Sharding channels = Sharding::Tiled(b.program().mesh(), {b.factor_axes()[channel]});
  Sharding partial = channels.WithPartial(StatAxes(b, stat_factors), ReduceOp::kSum);
  Ops ops(b, channels, x.global.shape[1]);

  LocalValue mean = ops.Scale(b.Resolve(ops.SumToChannels(x, dims, partial)), 1.0 / m);
  LocalValue dev = ops.Sub(x, ops.AsBroadcast(mean, x), x);
  std::vector<int> stat_dims(dims.begin(), dims.end());
  dev = MaskPadding(b.program(), dev, stat_dims, 0.0);
  LocalValue sq = ops.Mul(dev, dev, dev);
  LocalValue var = ops.Scale(b.Resolve(ops.SumToChannels(sq, dims, partial)), 1.0 / m);
  LocalValue invstd = ops.Rsqrt(ops.AddScalar(var, eps));

  // The normalization itself: eval-mode batch norm with the global statistics.
  std::vector<ir::Arg> args = b.WithSlots(n.args());
  std::vector<ir::Value> inputs;
  for (const LocalValue& v : operands) inputs.push_back(v.value);
  int rm_arg = ArgIndex(n, "running_mean"), rv_arg = ArgIndex(n, "running_var");
  inputs.push_back(mean.value);
  args[rm_arg] = Arg::Tensor(static_cast<int64_t>(inputs.size()) - 1);
  inputs.push_back(var.value);
  args[rv_arg] = Arg::Tensor(static_cast<int64_t>(inputs.size()) - 1);
  args[ArgIndex(n, "training")] = Arg::Bool(false);
  TensorType empty{x.value.type().dtype, {0}};
  // Five outputs: the op's three, plus the copies of its running stats the executor returns
  // (native_batch_norm writes them without saying so; op_plan.cc HiddenWrites).
  ir::NodePtr norm = b.program().Emit(
      n.op(), inputs, args, {x.value.type(), empty, empty, mean.value.type(), var.value.type()},
      {x.layout, channels, channels, channels, channels});
  LocalValue out{ir::Value{norm, 0}, b.result_layout(0), n.output(0)};

  std::vector<LocalValue> results{out, mean, invstd};
  if (running_mean) results.push_back(ops.AddScaled(ops.Scale(*running_mean, 1 - momentum), mean, momentum));
  if (running_var) {
    LocalValue unbiased = ops.Scale(var, m > 1 ? static_cast<double>(m) / (m - 1) : 1.0);
    results.push_back(ops.AddScaled(ops.Scale(*running_var, 1 - momentum), unbiased, momentum));
  }
  return results;
}

std::vector<LocalValue> SyncBackward(LocalBuilder& b, const std::vector<LocalValue>& operands,
                                     const std::vector<int>& stat_factors, int channel) {
  const ir::Node& n = b.node();
  const LocalValue& g = operands[InputOfArg(n, "grad_out")];
  const LocalValue& x = operands[InputOfArg(n, "input")];
  const LocalValue& save_mean = operands[InputOfArg(n, "save_mean")];
  const LocalValue& save_invstd = operands[InputOfArg(n, "save_invstd")];
  int weight_input = InputOfArg(n, "weight");
  const std::vector<int64_t>& mask = n.arg(ArgIndex(n, "output_mask")).ints;  // bool list
  int64_t m = NumElements(x.global.shape) / x.global.shape[1];
  std::vector<int64_t> dims = StatDims(x.global.rank());
  Sharding channels = Sharding::Tiled(b.program().mesh(), {b.factor_axes()[channel]});
  Sharding partial = channels.WithPartial(StatAxes(b, stat_factors), ReduceOp::kSum);
  Ops ops(b, channels, x.global.shape[1]);

  LocalValue xhat = ops.Mul(ops.Sub(x, ops.AsBroadcast(save_mean, x), x),
                               ops.AsBroadcast(save_invstd, x), x);
  LocalValue gx = ops.Mul(g, xhat, x);  // zero where g is masked padding
  auto [sum_g, sum_gx] =
      ops.ResolveBoth(ops.SumToChannels(g, dims, partial), ops.SumToChannels(gx, dims, partial));

  std::vector<LocalValue> results(3);
  if (mask.size() > 0 && mask[0]) {
    LocalValue scale = save_invstd;
    if (weight_input >= 0) scale = ops.Mul(scale, operands[weight_input], scale);
    LocalValue centered = ops.AddScaled(g, ops.AsBroadcast(sum_g, x), -1.0 / m);
    LocalValue projected = ops.Mul(xhat, ops.AsBroadcast(sum_gx, x), x);
    LocalValue grad = ops.AddScaled(centered, projected, -1.0 / m);
    results[0] = ops.Mul(grad, ops.AsBroadcast(scale, x), x);
    results[0].layout = b.result_layout(0);
    results[0].global = n.output(0);
  }
  if (mask.size() > 1 && mask[1]) results[1] = sum_gx;
  if (mask.size() > 2 && mask[2]) results[2] = sum_g;
  return results;  // masked-off outputs stay empty: the op returns no tensor for them
}

// native_batch_norm(input, weight?, bias?, running_mean?, running_var?, training, momentum,
// eps) -> (out, save_mean, save_invstd[, new running_mean, new running_var]);
// native_batch_norm_backward(grad_out, input, weight?, running_mean?, running_var?,
// save_mean?, save_invstd?, train, eps, output_mask) -> (grad_input, grad_weight, grad_bias).
std::optional<ShardingRule> BatchNorm(const ir::Node& node, bool backward) {
  const TensorType& input = node.input(InputOfArg(node, "input")).type();
  if (input.rank() < 2) return std::nullopt;
  bool training = BoolArg(node, ArgIndex(node, backward ? "train" : "training"), true);
  ShardingRule rule;
  rule.executor.reads_extents = false;  // channels are independent
  TensorFactors fin;
  int channel = -1;
  std::vector<int> stats;
  for (int64_t d = 0; d < input.rank(); ++d) {
    if (d == 1) {
      channel = rule.AddFactor(input.shape[d]);
      fin.push_back({channel});
      continue;
    }
    // Summed into the statistics (training) or the backward's weight/bias gradients.
    bool summed = training || backward;
    int f = rule.AddFactor(input.shape[d], summed ? FactorKind::kReduction : FactorKind::kPassThrough);
    stats.push_back(f);
    fin.push_back({f});
  }
  auto factors_for = [&](const TensorType& t) -> TensorFactors {
    if (t.shape == input.shape) return fin;
    if (t.rank() == 1 && t.shape[0] == input.shape[1]) return {{channel}};
    return TensorFactors(t.rank());
  };
  for (const ir::Value& in : node.inputs()) rule.operands.push_back(factors_for(in.type()));
  for (const TensorType& t : node.outputs())
    rule.results.push_back(t.dtype == DType::kUndefined ? TensorFactors() : factors_for(t));
  if (training) {
    rule.lowering.lower = [backward, stats, channel](LocalBuilder& b, const std::vector<LocalValue>& ops) {
      if (!StatsSharded(b, stats)) return b.EmitNodeOp(ops);  // local statistics are global
      return backward ? SyncBackward(b, ops, stats, channel) : SyncForward(b, ops, stats, channel);
    };
  }
  return rule;
}

}  // namespace

void RegisterBatchNormRules() {
  RegisterRule("aten::native_batch_norm", [](const ir::Node& n) { return BatchNorm(n, false); });
  RegisterRule("aten::native_batch_norm_backward",
               [](const ir::Node& n) { return BatchNorm(n, true); });
}

}  // namespace spmd::partition
