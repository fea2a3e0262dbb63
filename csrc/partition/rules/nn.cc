// Neural-network ops: losses with a `reduction` argument, layer norm, embedding (batch norm:
// batch_norm.cc).
// Their "mean" reductions divide by a global count, which a shard does not know: the lowerings
// below rescale local results by local/global extent or divide by a reduced global total, so
// the partial results sum to the single-device value.
#include "partition/local_builder.h"
#include "partition/rules/all_rules.h"
#include "partition/rules/local_ops.h"
#include "partition/rules/rule.h"

namespace spmd::partition {

namespace {

constexpr int64_t kReductionNone = 0, kReductionMean = 1;

// Local elements / global elements of v (the local count includes padding, which the masks
// have zeroed).
double LocalFraction(const LocalValue& v) {
  return static_cast<double>(NumElements(v.local_shape())) / NumElements(v.global.shape);
}

// loss(self, target, ..., reduction): elementwise over self's dims, then none/sum/mean.
// A sharded sum/mean runs the loss with reduction=none on the shard, zeroes the padding of the
// elementwise losses and sums them: masking the inputs instead is not enough, since most losses
// are not 0 at (0, 0) (soft margin and BCE-with-logits give log 2 there).
std::optional<ShardingRule> ReducingLoss(const ir::Node& node) {
  int reduction_arg = ArgIndex(node, "reduction");
  int reduction = static_cast<int>(IntArg(node, reduction_arg, kReductionMean));
  const TensorType& self = node.input(0).type();
  ShardingRule rule;
  rule.executor.reads_extents = false;  // kept rows are independent
  TensorFactors fs;
  for (int64_t size : self.shape)
    fs.push_back({rule.AddFactor(size, reduction == kReductionNone ? FactorKind::kPassThrough
                                                                   : FactorKind::kReduction)});
  // BCE kernels reject inputs outside [0, 1]: padding garbage must not reach them.
  if (node.op()->name == "aten::binary_cross_entropy")
    for (Factor& f : rule.factors) f.always_mask = true;
  for (const ir::Value& in : node.inputs()) rule.operands.push_back(BroadcastFactors(in.type(), self, fs));
  rule.results = {reduction == kReductionNone ? fs : TensorFactors{}};
  if (reduction == kReductionNone || reduction_arg < 0) return rule;
  rule.lowering.lower = [reduction_arg, reduction](LocalBuilder& b, const std::vector<LocalValue>& ops) {
    const ir::Node& n = b.node();
    bool sharded = false;
    for (const AxisList& a : b.factor_axes()) sharded |= !a.empty();
    if (!sharded) return b.EmitNodeOp(ops);
    const LocalValue& self = ops[0];
    std::vector<ir::Arg> args = b.WithSlots(n.args());
    args[reduction_arg] = ir::Arg::Int(kReductionNone);
    std::vector<ir::Value> inputs;
    for (const LocalValue& v : ops) inputs.push_back(v.value);
    const DType dtype = n.output(0).dtype;
    LocalValue each = b.EmitOp(n.op()->qualified.c_str(), n.op()->args, inputs, args,
                               TensorType{dtype, self.local_shape()}, self.layout.WithoutPartial(),
                               TensorType{dtype, self.global.shape});
    std::vector<int> dims;
    for (int64_t d = 0; d < self.global.rank(); ++d) dims.push_back(static_cast<int>(d));
    each = MaskPadding(b.program(), each, dims, 0.0);
    LocalValue total = b.EmitOp(
        "aten::sum", {{"self", ir::ArgType::kTensor}, {"dtype", ir::ArgType::kScalarType, true}},
        {each.value}, {ir::Arg::Tensor(0), ir::Arg::None()}, TensorType{dtype, {}},
        b.result_layout(0), n.output(0));
    if (reduction == kReductionMean)
      total = b.Scale(total, 1.0 / static_cast<double>(std::max<int64_t>(NumElements(self.global.shape), 1)));
    return std::vector<LocalValue>{total};
  };
  return rule;
}

// loss_backward(grad_output, self, target, ..., reduction): elementwise; a mean divided by the
// local count, so rescale by local/global.
std::optional<ShardingRule> LossBackward(const ir::Node& node) {
  int reduction = static_cast<int>(IntArg(node, ArgIndex(node, "reduction"), kReductionMean));
  const TensorType& out = node.output(0);
  ShardingRule rule;
  TensorFactors fo = PassThroughFactors(rule, out);
  if (node.op()->name == "aten::binary_cross_entropy_backward")
    for (Factor& f : rule.factors) f.always_mask = true;  // see ReducingLoss
  for (const ir::Value& in : node.inputs()) rule.operands.push_back(BroadcastFactors(in.type(), out, fo));
  rule.results = {fo};
  // A mean divides by the element count; sum and none are elementwise.
  rule.executor.reads_extents = reduction == kReductionMean;
  if (reduction == kReductionMean) {
    rule.lowering.lower = [](LocalBuilder& b, const std::vector<LocalValue>& ops) {
      std::vector<LocalValue> r = b.EmitNodeOp(ops);
      r[0] = b.Scale(r[0], LocalFraction(r[0]));
      return r;
    };
  }
  return rule;
}

// The class dim of nll_loss may stay sharded (Megatron's vocab-parallel cross entropy, after
// a log_softmax over sharded logits, softmax.cc): each device takes the targets that fall in
// its tile of classes, as local indices, and ignores the others like ignore_index, so the
// forward's loss and total weight are partial sums over the class axes and the backward
// writes each gradient on the device holding its class. A class weight is tiled like the
// classes: each target's weight lies on the device holding its log-probability.
constexpr int64_t kLocalIgnore = -1;  // never a local class index

// `target` made local to each device's tile of classes (tiles of `classes` over `axes`), with
// kLocalIgnore where it falls outside the tile or is `ignore_index`.
LocalValue LocalTargets(LocalBuilder& b, const LocalValue& target, const AxisList& axes,
                        int64_t classes, int64_t ignore_index) {
  LocalIndex idx = IndexIntoTile(b, target, axes, classes, ignore_index, /*mask_for_rows=*/false);
  return WhereElse(b, idx.in_range, idx.index, kLocalIgnore);
}

// The operands and args of an nll_loss node with the class factor `c` sharded: targets made
// local, ignore_index kLocalIgnore. Unchanged when `c` is not sharded.
void LocalizeClasses(LocalBuilder& b, int c, int64_t classes, std::vector<LocalValue>& ops,
                     std::vector<ir::Arg>& args) {
  const AxisList& axes = b.factor_axes()[c];
  if (axes.empty()) return;
  const ir::Node& n = b.node();
  const int target = InputOfArg(n, "target");
  const int ignore = ArgIndex(n, "ignore_index");
  ops[target] = LocalTargets(b, ops[target], axes, classes, IntArg(n, ignore, -100));
  args[ignore] = ir::Arg::Int(kLocalIgnore);
}

// nll_loss_forward(self [N,C] or [C], target [N] or [], weight [C]?, reduction, ignore_index)
// -> (output, total_weight). Padding rows read ignore_index as their target.
std::optional<ShardingRule> NllLoss(const ir::Node& node) {
  const TensorType& self = node.input(0).type();
  if (self.rank() != 2) return std::nullopt;
  const int reduction_arg = ArgIndex(node, "reduction");
  int reduction = static_cast<int>(IntArg(node, reduction_arg, kReductionMean));
  int64_t ignore_index = IntArg(node, ArgIndex(node, "ignore_index"), -100);
  ShardingRule rule;
  rule.executor.reads_extents = false;  // kept rows are independent
  int n = rule.AddFactor(self.shape[0], reduction == kReductionNone ? FactorKind::kPassThrough
                                                                    : FactorKind::kReduction);
  rule.factors[n].pad_value = static_cast<double>(ignore_index);
  rule.factors[n].always_mask = true;
  int c = rule.AddFactor(self.shape[1], FactorKind::kReduction);
  rule.factors[c].priority = -1;  // the rows keep their axes (rule.h)
  rule.operands = {{{n}, {c}}, {{n}}};
  if (node.inputs().size() > 2) rule.operands.push_back({{c}});  // weight
  rule.results = {reduction == kReductionNone ? TensorFactors{{n}} : TensorFactors{}, {}};
  if (reduction == kReductionNone) rule.reduced_in_result = {{c}, {n, c}};
  rule.lowering.lower = [reduction_arg, reduction, c](LocalBuilder& b, std::vector<LocalValue> ops) {
    std::vector<ir::Arg> args = b.WithSlots(b.node().args());
    LocalizeClasses(b, c, ops[0].local_shape()[1], ops, args);
    if (reduction != kReductionMean) return b.EmitNodeOp(ops, args);
    // Local sum and local total weight; output = sum / total over all devices. The total is
    // reduced now (the backward pass reads it); the output stays a pending partial sum.
    args[reduction_arg] = ir::Arg::Int(2);  // Sum
    std::vector<LocalValue> r = b.EmitNodeOp(ops, args);
    LocalValue total = b.Resolve(r[1]);
    LocalValue out = b.EmitOp(
        "aten::div.Tensor", {{"self", ir::ArgType::kTensor}, {"other", ir::ArgType::kTensor}},
        {r[0].value, total.value}, {ir::Arg::Tensor(0), ir::Arg::Tensor(1)}, r[0].value.type(),
        r[0].layout, r[0].global);
    return std::vector<LocalValue>{out, total};
  };
  return rule;
}

// nll_loss_backward(grad_output, self, target, weight?, reduction, ignore_index, total_weight)
// -> grad_input like self: rows and classes pass through (total_weight is already global; see
// NllLoss).
std::optional<ShardingRule> NllLossBackward(const ir::Node& node) {
  const TensorType& self = node.input(1).type();
  if (self.rank() != 2) return std::nullopt;
  int reduction = static_cast<int>(IntArg(node, ArgIndex(node, "reduction"), kReductionMean));
  int64_t ignore_index = IntArg(node, ArgIndex(node, "ignore_index"), -100);
  ShardingRule rule;
  rule.executor.reads_extents = false;  // kept rows are independent
  int n = rule.AddFactor(self.shape[0]);
  rule.factors[n].pad_value = static_cast<double>(ignore_index);
  rule.factors[n].always_mask = true;
  int c = rule.AddFactor(self.shape[1]);
  rule.factors[c].priority = -1;  // the rows keep their axes (rule.h)
  rule.factors[c].couples_tiles = true;  // written at each target's class
  rule.operands.resize(node.inputs().size());
  for (size_t i = 0; i < node.inputs().size(); ++i) rule.operands[i] = TensorFactors(node.input(i).type().rank());
  auto set = [&](const char* name, TensorFactors tf) {
    int i = InputOfArg(node, name);
    if (i >= 0) rule.operands[i] = std::move(tf);
  };
  set("self", {{n}, {c}});
  set("target", {{n}});
  set("weight", {{c}});
  if (reduction == kReductionNone) set("grad_output", {{n}});
  rule.results = {{{n}, {c}}};
  rule.cost.fuses_into_reader = true;  // a scaled one-hot of the targets
  rule.lowering.lower = [c](LocalBuilder& b, std::vector<LocalValue> ops) {
    std::vector<ir::Arg> args = b.WithSlots(b.node().args());
    LocalizeClasses(b, c, ops[InputOfArg(b.node(), "self")].local_shape()[1], ops, args);
    return b.EmitNodeOp(ops, args);
  };
  return rule;
}

// native_layer_norm(input, normalized_shape, weight?, bias?, eps) -> (out, mean, rstd): the
// leading (batch) dims pass through, the normalized dims replicate.
std::optional<ShardingRule> LayerNorm(const ir::Node& node, bool backward) {
  const TensorType& input = node.input(backward ? 1 : 0).type();
  std::vector<int64_t> ns = IntListArg(node, ArgIndex(node, "normalized_shape"));
  int64_t batch_dims = input.rank() - static_cast<int64_t>(ns.size());
  if (batch_dims < 0) return std::nullopt;
  ShardingRule rule;
  rule.executor.reads_extents = false;  // kept rows are independent
  TensorFactors fin, fstat, fparam;
  std::vector<int> batch;
  for (int64_t d = 0; d < input.rank(); ++d) {
    if (d < batch_dims) {
      int f = rule.AddFactor(input.shape[d], backward ? FactorKind::kReduction : FactorKind::kPassThrough);
      // Backward: the weight and bias gradients sum over the rows, the input's passes them.
      rule.factors[f].sums = backward;
      batch.push_back(f);
      fin.push_back({f});
      fstat.push_back({f});
    } else {
      int f = rule.AddFactor(input.shape[d], FactorKind::kNeedReplication);
      fin.push_back({f});
      fstat.push_back({});
      fparam.push_back({f});
    }
  }
  auto factors_for = [&](const TensorType& t) {
    if (t.shape == input.shape) return fin;
    if (t.rank() == input.rank()) return fstat;
    if (t.rank() == static_cast<int64_t>(ns.size())) return fparam;
    return TensorFactors(t.rank());
  };
  for (const ir::Value& in : node.inputs()) rule.operands.push_back(factors_for(in.type()));
  for (const TensorType& t : node.outputs())
    rule.results.push_back(t.dtype == DType::kUndefined ? TensorFactors() : factors_for(t));
  return rule;
}

// embedding(weight [V,D], indices [...]) -> [..., D]. The vocabulary may stay sharded
// (Megatron's vocab-parallel embedding): each device looks up the indices that fall in its
// rows and gives zeros for the others, so the result is a partial sum over the vocabulary's
// axes, all-reduced as activations instead of the table being all-gathered.
std::optional<ShardingRule> Embedding(const ir::Node& node) {
  const TensorType& weight = node.input(0).type();
  const TensorType& indices = node.input(1).type();
  if (weight.rank() != 2) return std::nullopt;
  ShardingRule rule;
  rule.executor.reads_extents = false;  // kept rows are independent
  const bool vocab_parallel = indices.rank() > 0;
  int v = rule.AddFactor(weight.shape[0], vocab_parallel ? FactorKind::kReduction
                                                         : FactorKind::kNeedReplication);
  // (Not Factor::sums: a lookup in concatenated tiles is not the sum of per-tile lookups.)
  rule.factors[v].priority = -1;  // the indices' batch dims keep their axes (rule.h)
  int d = rule.AddFactor(weight.shape[1]);
  TensorFactors fi = PassThroughFactors(rule, indices);
  // The padding of sharded index dims holds garbage that the kernel would reject as out of
  // range: read index 0 there (those output rows are padding too).
  for (const DimFactors& dim : fi) rule.factors[dim[0]].always_mask = true;
  TensorFactors fo = fi;
  fo.push_back({d});
  rule.operands = {{{v}, {d}}, fi};
  rule.results = {fo};
  rule.lowering.lower = [v](LocalBuilder& b, const std::vector<LocalValue>& ops) {
    const AxisList& axes = b.factor_axes()[v];
    if (axes.empty()) return b.EmitNodeOp(ops);
    const int64_t rows = ops[0].local_shape()[0];
    LocalIndex idx = IndexIntoTile(b, ops[1], axes, rows, /*exclude=*/-1, /*mask_for_rows=*/true);
    LocalValue looked_up = b.EmitNodeOp({ops[0], idx.index})[0];
    return std::vector<LocalValue>{WhereElseZero(b, idx.in_range, looked_up)};
  };
  return rule;
}

// embedding_dense_backward(grad [..., D], indices [...], num_weights, padding_idx, scale)
// -> [V, D]: every index position sums into the table, unless gradients are scaled by a
// frequency that only the whole batch knows. The table's rows may be sharded (the gradient of
// a vocab-parallel embedding): each device sums the positions whose index falls in its rows
// (and is not padding_idx) into them, no gradient of the whole table is formed.
std::optional<ShardingRule> EmbeddingBackward(const ir::Node& node) {
  const TensorType& grad = node.input(0).type();
  const TensorType& indices = node.input(1).type();
  bool scale_by_freq = BoolArg(node, ArgIndex(node, "scale_grad_by_freq"), false);
  ShardingRule rule;
  rule.executor.reads_extents = false;  // kept rows are independent
  TensorFactors fi;
  for (int64_t size : indices.shape) {
    fi.push_back({rule.AddFactor(size, scale_by_freq ? FactorKind::kNeedReplication : FactorKind::kReduction)});
    rule.factors[fi.back()[0]].sums = !scale_by_freq;  // each position adds into the table
  }
  int d = rule.AddFactor(grad.shape.back());
  const int num_weights = ArgIndex(node, "num_weights");
  const int padding = ArgIndex(node, "padding_idx");
  // (Frequencies count every position, the other devices' too: the rows then replicate.)
  const bool row_parallel =
      !scale_by_freq && indices.rank() > 0 && num_weights >= 0 && padding >= 0;
  int v = rule.AddFactor(node.output(0).shape[0],
                         row_parallel ? FactorKind::kPassThrough : FactorKind::kNeedReplication);
  rule.factors[v].priority = -1;  // the positions' dims keep their axes (rule.h)
  rule.factors[v].couples_tiles = true;  // summed into the row each index names
  TensorFactors fg = fi;
  fg.push_back({d});
  rule.operands = {fg, fi};
  rule.results = {{{v}, {d}}};
  if (!row_parallel) return rule;
  const int64_t padding_idx = node.args()[padding].i;
  rule.lowering.lower = [v, num_weights, padding, padding_idx](LocalBuilder& b,
                                                      const std::vector<LocalValue>& ops) {
    const AxisList& axes = b.factor_axes()[v];
    if (axes.empty()) return b.EmitNodeOp(ops);
    const int64_t rows = b.result_layout(0).ShardShape(b.node().output(0).shape)[0];
    LocalIndex idx = IndexIntoTile(b, ops[1], axes, rows, padding_idx, /*mask_for_rows=*/true);
    std::vector<ir::Arg> args = b.WithSlots(b.node().args());
    args[num_weights] = ir::Arg::Int(rows);
    args[padding] = ir::Arg::Int(-1);  // masked above, by its global index
    return b.EmitNodeOp({WhereElseZero(b, idx.in_range, ops[0]), idx.index}, std::move(args));
  };
  return rule;
}

}  // namespace

void RegisterNNRules() {
  RegisterRules({"aten::mse_loss", "aten::smooth_l1_loss", "aten::huber_loss",
                 "aten::binary_cross_entropy", "aten::soft_margin_loss", "aten::l1_loss",
                 "aten::binary_cross_entropy_with_logits"},
                ReducingLoss);
  RegisterRules({"aten::mse_loss_backward", "aten::smooth_l1_loss_backward",
                 "aten::huber_loss_backward", "aten::binary_cross_entropy_backward",
                 "aten::soft_margin_loss_backward"},
                LossBackward);
  RegisterRule("aten::nll_loss_forward", NllLoss);
  RegisterRule("aten::nll_loss_backward", NllLossBackward);
  RegisterRule("aten::native_layer_norm", [](const ir::Node& n) { return LayerNorm(n, false); });
  RegisterRule("aten::native_layer_norm_backward", [](const ir::Node& n) { return LayerNorm(n, true); });
  RegisterRule("aten::embedding", Embedding);
  RegisterRule("aten::embedding_dense_backward", EmbeddingBackward);
}

}  // namespace spmd::partition
