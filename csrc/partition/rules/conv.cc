// Convolution, forward and backward, for any number of spatial dims:
//
//   convolution(input [N, C, S...], weight [O, C/g, K...], bias [O]) -> [N, O, S'...]
//   transposed: weight [C, O/g, K...]
//
// Factors: batch n; with g > 1 groups a group factor G, so that channels are compound
// C = [G, ci] and O = [G, co] (sharding the channels of a depthwise conv shards G, and the local
// op runs with g / tiles(G) groups); ci, the input channels within a group, is the forward's
// reduction (zero-masked padding; sharding it leaves partial sums, and the bias is added once
// after they are reduced); co passes through; the spatial dims are windowed factors shared by
// input and output (window.h: halo exchange, local op with padding 0 on sharded dims) where
// the geometry allows and need replication otherwise (always for transposed convs); kernel
// dims need replication.
//
// convolution_backward(grad_output, input, weight, ...) -> grad_input, grad_weight, grad_bias:
// grad_input sums over co; grad_weight and grad_bias over n and space (their partial sums over
// the spatial tiles are reduced like any other); grad_bias does not depend on ci at all. With
// sharded space, grad_weight comes from a local backward on the input extended by its halos
// (the whole contribution of the device's output rows). grad_input comes, where the geometry
// allows (always at stride 1), from a local backward on a halo of grad_output that yields
// exactly the input tile (window.h, GradHalo); otherwise from the same backward as grad_weight,
// over the extended rows, whose halo part belongs to the neighbours: HaloReduce adds it there.
#include "core/error.h"
#include "partition/halo.h"
#include "partition/rules/all_rules.h"
#include "partition/rules/local_ops.h"
#include "partition/rules/rule.h"
#include "partition/rules/window.h"

namespace spmd::partition {

namespace {

using ir::Arg;
using ir::ArgType;

struct ConvGeometry {
  bool transposed = false;
  int64_t groups = 1;
  std::vector<int64_t> padding;
  std::vector<Window> windows;  // per spatial dim
};

std::optional<ConvGeometry> ReadGeometry(const ir::Node& node, const TensorType& input,
                                         const TensorType& weight, const TensorType& output) {
  const int64_t rank = input.rank();
  if (rank < 3 || weight.rank() != rank || output.rank() != rank) return std::nullopt;
  const size_t spatial = static_cast<size_t>(rank - 2);
  ConvGeometry c;
  c.transposed = BoolArg(node, ArgIndex(node, "transposed"));
  c.groups = IntArg(node, ArgIndex(node, "groups"), 1);
  std::vector<int64_t> stride =
      SpatialList(node, "stride", spatial, std::vector<int64_t>(spatial, 1));
  std::vector<int64_t> dilation =
      SpatialList(node, "dilation", spatial, std::vector<int64_t>(spatial, 1));
  c.padding = SpatialList(node, "padding", spatial, std::vector<int64_t>(spatial, 0));
  if (stride.size() != spatial || dilation.size() != spatial || c.padding.size() != spatial)
    return std::nullopt;
  const int64_t in_ch = input.shape[1], out_ch = output.shape[1];
  if (c.groups < 1 || in_ch % c.groups != 0 || out_ch % c.groups != 0) return std::nullopt;
  for (size_t d = 0; d < spatial; ++d) {
    Window w;
    w.in = input.shape[2 + d];
    w.out = output.shape[2 + d];
    w.kernel = weight.shape[2 + d];
    w.stride = stride[d];
    w.dilation = dilation[d];
    w.pad = c.padding[d];
    c.windows.push_back(w);
  }
  return c;
}

struct ConvFactors {
  int n = -1, g = -1, ci = -1, co = -1;
  SpatialDims space;
  std::vector<int> kernel;

  DimFactors InChannels() const { return g < 0 ? DimFactors{ci} : DimFactors{g, ci}; }
  DimFactors OutChannels() const { return g < 0 ? DimFactors{co} : DimFactors{g, co}; }
  TensorFactors Activation(bool output) const {
    TensorFactors t = {{n}, output ? OutChannels() : InChannels()};
    for (int f : space.factors) t.push_back({f});
    return t;
  }
  TensorFactors Weight(bool transposed) const {
    TensorFactors t =
        transposed ? TensorFactors{InChannels(), {co}} : TensorFactors{OutChannels(), {ci}};
    for (int f : kernel) t.push_back({f});
    return t;
  }
  // Groups of the local op: the groups tiled over G leave g / tiles(G) on each device.
  int64_t LocalGroups(const LocalBuilder& b, int64_t groups) const {
    return g < 0 ? groups : groups / AxesSize(b.mesh(), b.factor_axes()[g]);
  }
};

// Factors of a convolution with `input` and `output` (grad_output in backward) activations.
// Backward: n and co become reductions (summed into grad_weight/grad_bias and into grad_input);
// forward: ci is the reduction.
ConvFactors AddConvFactors(ShardingRule& rule, const ConvGeometry& c, const TensorType& input,
                           const TensorType& output, const TensorType& weight, bool backward) {
  ConvFactors f;
  f.n =
      rule.AddFactor(input.shape[0], backward ? FactorKind::kReduction : FactorKind::kPassThrough);
  if (c.groups > 1) f.g = rule.AddFactor(c.groups);
  f.ci = rule.AddFactor(input.shape[1] / c.groups,
                        backward ? FactorKind::kPassThrough : FactorKind::kReduction);
  f.co = rule.AddFactor(output.shape[1] / c.groups,
                        backward ? FactorKind::kReduction : FactorKind::kPassThrough);
  f.space.first_dim = 2;
  f.space.windows = c.windows;
  for (const Window& w : c.windows)
    f.space.factors.push_back(AddSpatialFactor(rule, w, !c.transposed));
  for (int64_t d = 2; d < weight.rank(); ++d)
    f.kernel.push_back(rule.AddFactor(weight.shape[d], FactorKind::kNeedReplication));
  return f;
}

LocalValue ViewAs(LocalBuilder& b, const LocalValue& x, const Shape& shape) {
  static const std::vector<ir::ArgSchema> schema = {{"self", ArgType::kTensor},
                                                    {"size", ArgType::kIntList}};
  return b.EmitOp("aten::view_copy", schema, {x.value}, {Arg::Tensor(0), Arg::IntList(shape)},
                  TensorType{x.value.type().dtype, shape}, x.layout, x.global);
}

// convolution(input, weight, bias?, stride, padding, dilation, transposed, output_padding, groups)
std::optional<ShardingRule> Convolution(const ir::Node& node) {
  const int in = InputOfArg(node, "input"), wt = InputOfArg(node, "weight");
  const int bias = InputOfArg(node, "bias");
  if (in < 0 || wt < 0) return std::nullopt;
  const TensorType& input = node.input(in).type();
  const TensorType& weight = node.input(wt).type();
  std::optional<ConvGeometry> c = ReadGeometry(node, input, weight, node.output(0));
  if (!c) return std::nullopt;
  ShardingRule rule;
  ConvFactors f = AddConvFactors(rule, *c, input, node.output(0), weight, /*backward=*/false);
  rule.operands.resize(node.inputs().size());
  rule.operands[in] = f.Activation(false);
  rule.operands[wt] = f.Weight(c->transposed);
  if (bias >= 0) rule.operands[bias] = {f.OutChannels()};
  rule.results = {f.Activation(true)};
  rule.cost.flops_per_point = 2;  // a multiply-add per (n, g, ci, co, output position, kernel tap)

  const int pad_arg = ArgIndex(node, "padding"), groups_arg = ArgIndex(node, "groups");
  const int bias_arg = ArgIndex(node, "bias");
  rule.lowering.lower = [c = *c, f, in, bias, pad_arg, groups_arg, bias_arg](
                   LocalBuilder& b, const std::vector<LocalValue>& ops) {
    std::vector<LocalValue> operands = ops;
    std::vector<int64_t> padding = c.padding;
    operands[in] = f.space.Extend(b, operands[in], padding, 0.0);
    std::vector<Arg> args = b.WithSlots(b.node().args());
    args[pad_arg] = Arg::IntList(padding);
    args[groups_arg] = Arg::Int(f.LocalGroups(b, c.groups));
    if (bias < 0 || b.factor_axes()[f.ci].empty()) return b.EmitNodeOp(operands, args);
    // Sharded input channels leave partial sums: add the bias once, after reducing them.
    SPMD_CHECK(bias == static_cast<int>(operands.size()) - 1, "internal error: conv bias input");
    LocalValue bias_v = operands.back();
    operands.pop_back();
    args[bias_arg] = Arg::None();
    LocalValue sum = b.Resolve(b.EmitNodeOp(operands, args)[0]);
    Shape bias_shape(sum.value.type().rank(), 1);
    bias_shape[1] = bias_v.value.type().shape[0];
    return std::vector<LocalValue>{Binary(b, "aten::add.Tensor", sum, ViewAs(b, bias_v, bias_shape))};
  };
  return rule;
}

// What the local convolution_backward reads besides its operands.
struct ConvBackwardArgs {
  ConvGeometry c;
  ConvFactors f;
  int go, in;  // grad_output's and input's positions among the node inputs
  std::vector<int64_t> mask;  // output_mask
  int pad_arg, groups_arg, bias_sizes_arg, mask_arg;
};

std::vector<LocalValue> LowerConvolutionBackward(LocalBuilder& b, const std::vector<LocalValue>& ops,
                                                 const ConvBackwardArgs& a) {
  const ConvGeometry& c = a.c;
  const ConvFactors& f = a.f;
  const int go = a.go, in = a.in, pad_arg = a.pad_arg, mask_arg = a.mask_arg;
  const std::vector<int64_t>& mask = a.mask;
  std::vector<Arg> base = b.WithSlots(b.node().args());
  base[a.groups_arg] = Arg::Int(f.LocalGroups(b, c.groups));
  std::vector<TensorType> types = {LocalResultType(b, 0), LocalResultType(b, 1),
                                   LocalResultType(b, 2)};
  const TensorType none{DType::kUndefined, {}};
  if (types[2].dtype != DType::kUndefined && a.bias_sizes_arg >= 0)
    base[a.bias_sizes_arg] = Arg::IntList(types[2].shape);
  auto with = [&](std::vector<int64_t> padding, std::vector<int64_t> output_mask) {
    std::vector<Arg> args = base;
    args[pad_arg] = Arg::IntList(std::move(padding));
    args[mask_arg].ints = std::move(output_mask);
    return args;
  };

  // grad_input from a halo of grad_output (window.h, GradHalo) where every sharded dim
  // allows it: no extended gradient, no overlap-add.
  const bool want_input = types[0].dtype != DType::kUndefined;
  bool from_grad_halo = want_input && f.space.AnySharded(b);
  std::vector<int64_t> gi_padding = c.padding, gl(c.padding.size()), gr(c.padding.size());
  for (size_t d = 0; d < c.padding.size() && from_grad_halo; ++d)
    if (f.space.Sharded(b, d))
      from_grad_halo =
          c.windows[d].GradHalo(AxesSize(b.mesh(), b.factor_axes()[f.space.factors[d]]), &gl[d],
                                &gr[d], &gi_padding[d]);

  if (!from_grad_halo) {
    // One local backward on the input extended by its halos (its values matter only to
    // grad_weight); the extended grad_input is overlap-added into the neighbours' tiles.
    std::vector<LocalValue> operands = ops;
    std::vector<int64_t> padding = c.padding;
    operands[in] = f.space.Extend(b, operands[in], padding, 0.0, /*exchange=*/mask[1] != 0);
    if (want_input) types[0].shape = operands[in].value.type().shape;
    std::vector<LocalValue> r = EmitWithTypes(b, operands, with(padding, mask), types);
    if (want_input) r[0] = f.space.Reduce(b, r[0], b.result_layout(0));
    return r;
  }
  // grad_weight/grad_bias first, from the input extended by its halos (which then dies)...
  std::vector<LocalValue> r(3);
  if (mask[1] || mask[2]) {
    std::vector<LocalValue> operands = ops;
    std::vector<int64_t> padding = c.padding;
    operands[in] = f.space.Extend(b, operands[in], padding, 0.0, /*exchange=*/mask[1] != 0);
    std::vector<LocalValue> w = EmitWithTypes(b, operands, with(padding, {0, mask[1], mask[2]}),
                                              {none, types[1], types[2]});
    r[1] = w[1];
    r[2] = w[2];
  }
  // ... then grad_input of the input tile itself, from grad_output extended by its halos.
  std::vector<LocalValue> operands = ops;
  for (size_t d = 0; d < c.padding.size(); ++d)
    if (f.space.Sharded(b, d))
      operands[go] = HaloExchange(b, operands[go], f.space.first_dim + static_cast<int64_t>(d),
                                  gl[d], gr[d], 0.0);
  std::vector<LocalValue> g =
      EmitWithTypes(b, operands, with(gi_padding, {1, 0, 0}), {types[0], none, none});
  r[0] = g[0];
  if (!(mask[1] || mask[2])) r[1] = g[1], r[2] = g[2];
  return r;
}

// convolution_backward(grad_output, input, weight, bias_sizes?, stride, padding, dilation,
// transposed, output_padding, groups, output_mask) -> (grad_input, grad_weight, grad_bias)
std::optional<ShardingRule> ConvolutionBackward(const ir::Node& node) {
  const int go = InputOfArg(node, "grad_output"), in = InputOfArg(node, "input");
  const int wt = InputOfArg(node, "weight");
  if (go < 0 || in < 0 || wt < 0 || node.num_outputs() != 3) return std::nullopt;
  const TensorType& grad_out = node.input(go).type();
  const TensorType& input = node.input(in).type();
  const TensorType& weight = node.input(wt).type();
  std::optional<ConvGeometry> c = ReadGeometry(node, input, weight, grad_out);
  if (!c) return std::nullopt;
  const int mask_arg = ArgIndex(node, "output_mask");  // bool[3], stored as ints
  if (mask_arg < 0 || node.arg(mask_arg).ints.size() != 3) return std::nullopt;
  const std::vector<int64_t> mask = node.arg(mask_arg).ints;

  ShardingRule rule;
  ConvFactors f = AddConvFactors(rule, *c, input, grad_out, weight, /*backward=*/true);
  rule.operands.resize(node.inputs().size());
  rule.operands[go] = f.Activation(true);
  rule.operands[in] = f.Activation(false);
  rule.operands[wt] = f.Weight(c->transposed);
  auto defined = [&](int o) { return node.output(o).dtype != DType::kUndefined; };
  rule.results = {defined(0) ? f.Activation(false) : TensorFactors(),
                  defined(1) ? f.Weight(c->transposed) : TensorFactors(),
                  defined(2) ? TensorFactors{f.OutChannels()} : TensorFactors()};
  std::vector<int> batch_and_space = {f.n};
  for (int s : f.space.factors) batch_and_space.push_back(s);
  rule.reduced_in_result = {{f.co}, batch_and_space, batch_and_space};
  // The same iteration space as the forward once per gradient computed (input, weight); the
  // bias gradient is a sum over grad_output.
  const int grads = (defined(0) ? 1 : 0) + (defined(1) ? 1 : 0);
  if (grads > 0) rule.cost.flops_per_point = 2.0 * grads;

  const int pad_arg = ArgIndex(node, "padding"), groups_arg = ArgIndex(node, "groups");
  const int bias_sizes_arg = ArgIndex(node, "bias_sizes");
  rule.lowering.lower = [args = ConvBackwardArgs{*c, f, go, in, mask, pad_arg, groups_arg, bias_sizes_arg,
                                        mask_arg}](LocalBuilder& b,
                                                   const std::vector<LocalValue>& ops) {
    return LowerConvolutionBackward(b, ops, args);
  };
  return rule;
}

}  // namespace

void RegisterConvRules() {
  RegisterRule("aten::convolution", Convolution);
  RegisterRule("aten::convolution_backward", ConvolutionBackward);
}

}  // namespace spmd::partition
