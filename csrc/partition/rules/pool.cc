// 2-d pooling, forward and backward: max_pool2d_with_indices, avg_pool2d,
// _adaptive_avg_pool2d. Leading dims (batch, channels) pass through; the two spatial dims are
// windowed factors (window.h) where the geometry allows:
// - max pooling pads with -inf; its indices are flat positions in the *global* H*W plane, so a
//   spatially sharded forward converts its local indices (into the device's extended tile) to
//   global ones, and the backward converts them back;
// - avg pooling pads with 0, which is exactly count_include_pad; with count_include_pad=False
//   the divisor would have to know which halo rows are padding, so a padded dim is not
//   partitioned then;
// - adaptive pooling is partitioned when the input extent is a multiple of the output extent
//   (then it is a plain pooling with kernel = stride and no halo).
// ceil_mode is partitioned only where it changes nothing (the local op runs in floor mode).
// The backward ops read only the shape of `self`: it is padded locally, not exchanged.
#include <limits>

#include "ir/internal_ops.h"
#include "partition/halo.h"
#include "partition/rules/all_rules.h"
#include "partition/rules/local_ops.h"
#include "partition/rules/rule.h"
#include "partition/rules/window.h"

namespace spmd::partition {

namespace {

using ir::Arg;
using ir::ArgType;

constexpr int64_t kSpatial = 2;

struct PoolGeometry {
  std::vector<int64_t> padding;
  std::vector<Window> windows;
};

// kernel_size, stride (empty = kernel), padding, dilation (absent for avg pooling).
std::optional<PoolGeometry> ReadPool(const ir::Node& node, const TensorType& self,
                                     const TensorType& out) {
  if (self.rank() < 3 || self.rank() > 4 || out.rank() != self.rank()) return std::nullopt;
  std::vector<int64_t> kernel = SpatialList(node, "kernel_size", kSpatial, {});
  std::vector<int64_t> stride = SpatialList(node, "stride", kSpatial, kernel);
  std::vector<int64_t> dilation = SpatialList(node, "dilation", kSpatial, {1, 1});
  PoolGeometry g;
  g.padding = SpatialList(node, "padding", kSpatial, {0, 0});
  if (kernel.size() != 2 || stride.size() != 2 || dilation.size() != 2 || g.padding.size() != 2)
    return std::nullopt;
  for (int64_t d = 0; d < kSpatial; ++d) {
    Window w;
    w.in = self.shape[self.rank() - kSpatial + d];
    w.out = out.shape[out.rank() - kSpatial + d];
    w.kernel = kernel[d];
    w.stride = stride[d];
    w.dilation = dilation[d];
    w.pad = g.padding[d];
    g.windows.push_back(w);
  }
  return g;
}

// The rule skeleton: leading dims pass through, spatial dims windowed where `allow(d)`.
template <typename Allow>
std::pair<ShardingRule, SpatialDims> PoolRule(const TensorType& self, const PoolGeometry& g,
                                              Allow allow, TensorFactors* fin,
                                              TensorFactors* fout) {
  ShardingRule rule;
  SpatialDims space;
  space.first_dim = self.rank() - kSpatial;
  space.windows = g.windows;
  for (int64_t d = 0; d < space.first_dim; ++d) fin->push_back({rule.AddFactor(self.shape[d])});
  *fout = *fin;
  for (int64_t d = 0; d < kSpatial; ++d) {
    int f = AddSpatialFactor(rule, g.windows[d], allow(d));
    space.factors.push_back(f);
    fin->push_back({f});
    fout->push_back({f});
  }
  return {std::move(rule), std::move(space)};
}

// The node's args with padding zeroed on the sharded spatial dims and floor mode when any is.
std::vector<Arg> LocalPoolArgs(LocalBuilder& b, const SpatialDims& space,
                               const std::vector<int64_t>& padding) {
  std::vector<Arg> args = b.WithSlots(b.node().args());
  if (!space.AnySharded(b)) return args;
  args[ArgIndex(b.node(), "padding")] = Arg::IntList(padding);
  int ceil = ArgIndex(b.node(), "ceil_mode");
  if (ceil >= 0) args[ceil] = Arg::Bool(false);
  return args;
}

// ---- max pooling indices: local (extended tile) <-> global flat positions ----

LocalValue FloorDiv(LocalBuilder& b, const LocalValue& x, int64_t v) {
  static const std::vector<ir::ArgSchema> schema = {{"self", ArgType::kTensor},
                                                    {"other", ArgType::kScalar},
                                                    {"rounding_mode", ArgType::kString, true}};
  return b.EmitOp("aten::div.Scalar_mode", schema, {x.value},
                  {Arg::Tensor(0), Arg::ScalarInt(v), Arg::String("floor")}, x.value.type(), x.layout,
                  x.global);
}

// Re-encodes flat (h, w) positions from a plane of width `from_w` to one of width `to_w`,
// adding `sign` * the device's row offset on each sharded spatial dim.
LocalValue RemapIndices(LocalBuilder& b, const SpatialDims& space, LocalValue idx, int64_t from_w,
                        int64_t to_w, int sign) {
  LocalValue h = FloorDiv(b, idx, from_w);
  LocalValue w = WithScalar(b, "aten::remainder.Scalar", idx, from_w);
  LocalValue* coord[2] = {&h, &w};
  for (size_t d = 0; d < 2; ++d) {
    if (!space.Sharded(b, d)) continue;
    const Window& win = space.windows[d];
    const AxisList& axes = b.factor_axes()[space.factors[d]];
    LocalValue off = RowOffset(b, axes, win.in / AxesSize(b.mesh(), axes), win.Left());
    *coord[d] = Binary(b, "aten::add.Tensor", *coord[d], off, sign);
  }
  return Binary(b, "aten::add.Tensor", w, WithScalar(b, "aten::mul.Scalar", h, to_w));
}

// max_pool2d_with_indices(self, kernel_size, stride, padding, dilation, ceil_mode)
std::optional<ShardingRule> MaxPool(const ir::Node& node) {
  const TensorType& self = node.input(0).type();
  std::optional<PoolGeometry> g = ReadPool(node, self, node.output(0));
  if (!g || node.num_outputs() != 2) return std::nullopt;
  TensorFactors fin, fout;
  auto [rule, space] = PoolRule(
      self, *g, [](int64_t) { return true; }, &fin, &fout);
  rule.operands = {fin};
  rule.results = {fout, fout};
  rule.lowering.lower = [g = *g, space = space](LocalBuilder& b, const std::vector<LocalValue>& ops) {
    std::vector<int64_t> padding = g.padding;
    LocalValue x = space.Extend(b, ops[0], padding, -std::numeric_limits<double>::infinity());
    std::vector<LocalValue> r = b.EmitNodeOp({x}, LocalPoolArgs(b, space, padding));
    if (space.AnySharded(b))
      r[1] = RemapIndices(b, space, r[1], x.value.type().shape.back(), g.windows[1].in, +1);
    return r;
  };
  return rule;
}

// max_pool2d_with_indices_backward(grad_output, self, kernel_size, stride, padding, dilation,
// ceil_mode, indices)
std::optional<ShardingRule> MaxPoolBackward(const ir::Node& node) {
  const int go = InputOfArg(node, "grad_output"), in = InputOfArg(node, "self");
  const int idx = InputOfArg(node, "indices");
  if (go < 0 || in < 0 || idx < 0) return std::nullopt;
  const TensorType& self = node.input(in).type();
  std::optional<PoolGeometry> g = ReadPool(node, self, node.input(go).type());
  if (!g) return std::nullopt;
  TensorFactors fin, fout;
  auto [rule, space] = PoolRule(
      self, *g, [](int64_t) { return true; }, &fin, &fout);
  rule.operands.resize(3);
  rule.operands[go] = fout;
  rule.operands[in] = fin;
  rule.operands[idx] = fout;
  rule.results = {fin};
  rule.shape_only_operands.assign(3, false);
  rule.shape_only_operands[in] = true;
  rule.lowering.lower = [g = *g, space = space, in, idx](LocalBuilder& b,
                                                const std::vector<LocalValue>& ops) {
    std::vector<LocalValue> operands = ops;
    std::vector<int64_t> padding = g.padding;
    if (!space.AnySharded(b)) return b.EmitNodeOp(operands);
    operands[in] = space.Extend(b, operands[in], padding, 0.0, /*exchange=*/false);
    const Shape& ext = operands[in].value.type().shape;
    operands[idx] = RemapIndices(b, space, operands[idx], g.windows[1].in, ext.back(), -1);
    TensorType type{b.node().output(0).dtype, ext};
    std::vector<LocalValue> r =
        EmitWithTypes(b, operands, LocalPoolArgs(b, space, padding), {type});
    r[0] = space.Reduce(b, r[0], b.result_layout(0));
    return r;
  };
  return rule;
}

// avg_pool2d(self, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override)
// and avg_pool2d_backward(grad_output, self, <the same>).
std::optional<ShardingRule> AvgPool(const ir::Node& node, bool backward) {
  const int go = backward ? InputOfArg(node, "grad_output") : -1;
  const int in = InputOfArg(node, "self");
  if (in < 0 || (backward && go < 0)) return std::nullopt;
  const TensorType& self = node.input(in).type();
  const TensorType& out = backward ? node.input(go).type() : node.output(0);
  std::optional<PoolGeometry> g = ReadPool(node, self, out);
  if (!g) return std::nullopt;
  bool include_pad = BoolArg(node, ArgIndex(node, "count_include_pad"), true);
  TensorFactors fin, fout;
  auto allow = [&](int64_t d) { return include_pad || g->padding[d] == 0; };
  auto [rule, space] = PoolRule(self, *g, allow, &fin, &fout);
  if (!backward) {
    rule.operands = {fin};
    rule.results = {fout};
    rule.lowering.lower = [g = *g, space = space](LocalBuilder& b, const std::vector<LocalValue>& ops) {
      std::vector<int64_t> padding = g.padding;
      LocalValue x = space.Extend(b, ops[0], padding, 0.0);
      return b.EmitNodeOp({x}, LocalPoolArgs(b, space, padding));
    };
    return rule;
  }
  rule.operands.resize(2);
  rule.operands[go] = fout;
  rule.operands[in] = fin;
  rule.results = {fin};
  rule.shape_only_operands.assign(2, false);
  rule.shape_only_operands[in] = true;
  rule.lowering.lower = [g = *g, space = space, in](LocalBuilder& b, const std::vector<LocalValue>& ops) {
    std::vector<LocalValue> operands = ops;
    std::vector<int64_t> padding = g.padding;
    if (!space.AnySharded(b)) return b.EmitNodeOp(operands);
    operands[in] = space.Extend(b, operands[in], padding, 0.0, /*exchange=*/false);
    TensorType type{b.node().output(0).dtype, operands[in].value.type().shape};
    std::vector<LocalValue> r =
        EmitWithTypes(b, operands, LocalPoolArgs(b, space, padding), {type});
    r[0] = space.Reduce(b, r[0], b.result_layout(0));
    return r;
  };
  return rule;
}

// _adaptive_avg_pool2d(self, output_size) and _adaptive_avg_pool2d_backward(grad_output, self):
// output row j averages input rows [floor(j*L/O), ceil((j+1)*L/O)); with O dividing L that is
// a pooling with kernel = stride = L/O, whose tiles need no halo.
std::optional<ShardingRule> AdaptiveAvgPool(const ir::Node& node, bool backward) {
  const TensorType& self = node.input(backward ? 1 : 0).type();
  const TensorType& out = backward ? node.input(0).type() : node.output(0);
  if (self.rank() < 3 || self.rank() > 4 || out.rank() != self.rank()) return std::nullopt;
  PoolGeometry g;
  g.padding = {0, 0};
  for (int64_t d = 0; d < kSpatial; ++d) {
    Window w;
    w.in = self.shape[self.rank() - kSpatial + d];
    w.out = out.shape[out.rank() - kSpatial + d];
    w.kernel = w.stride = w.out > 0 ? w.in / w.out : 1;
    g.windows.push_back(w);
  }
  auto allow = [&](int64_t d) {
    return g.windows[d].out > 0 && g.windows[d].in % g.windows[d].out == 0;
  };
  TensorFactors fin, fout;
  auto [rule, space] = PoolRule(self, g, allow, &fin, &fout);
  if (backward) {
    rule.operands = {fout, fin};
    rule.results = {fin};
    rule.shape_only_operands = {false, true};
    return rule;
  }
  rule.operands = {fin};
  rule.results = {fout};
  rule.lowering.local_args = [](const ir::Node& n, const std::vector<Shape>& local) {
    std::vector<Arg> args = n.args();
    const Shape& s = local.at(0);
    args[ArgIndex(n, "output_size")] = Arg::IntList({s[s.size() - 2], s[s.size() - 1]});
    return args;
  };
  return rule;
}

}  // namespace

void RegisterPoolRules() {
  RegisterRule("aten::max_pool2d_with_indices", MaxPool);
  RegisterRule("aten::max_pool2d_with_indices_backward", MaxPoolBackward);
  RegisterRule("aten::avg_pool2d", [](const ir::Node& n) { return AvgPool(n, false); });
  RegisterRule("aten::avg_pool2d_backward", [](const ir::Node& n) { return AvgPool(n, true); });
  RegisterRule("aten::_adaptive_avg_pool2d",
               [](const ir::Node& n) { return AdaptiveAvgPool(n, false); });
  RegisterRule("aten::_adaptive_avg_pool2d_backward",
               [](const ir::Node& n) { return AdaptiveAvgPool(n, true); });
}

}  // namespace spmd::partition
