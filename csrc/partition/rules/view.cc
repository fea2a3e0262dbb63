// Shape and layout ops of the functional IR: reshapes (compound factors), permutations,
// broadcasts, squeeze/unsqueeze, slicing and selection, concatenation and splitting, the
// scatter ops functionalization emits for writes through views, and ops whose result depends
// on absolute positions along some dims (cumsum, tril, sort, ...). A dim that is cut,
// shifted or read at absolute positions needs replication; the others pass through.
#include <algorithm>

#include "partition/rules/all_rules.h"
#include "partition/rules/rule.h"

namespace spmd::partition {

namespace {

int64_t Dim(const ir::Node& n, const char* name, int64_t rank, int64_t default_value = 0) {
  int idx = ArgIndex(n, name);
  if (idx < 0 || n.arg(idx).is_none()) return default_value;
  return WrapDim(n.arg(idx).i, rank);
}

// Rewrites the arg named `name` to the local shape of result 0.
RuleBuilder WithLocalSize(RuleBuilder inner, const char* name) {
  return [inner, name](const ir::Node& node) -> std::optional<ShardingRule> {
    std::optional<ShardingRule> rule = inner(node);
    int idx = ArgIndex(node, name);
    if (!rule || idx < 0) return rule;
    rule->lowering.local_args = LocalSizeArgs(idx, ArgIndex(node, "stride"));

    return rule;
  };
}

// view/reshape: walk both shapes in groups of consecutive dims with equal products; inside a
// group, factor both sides by the common refinement of their cumulative products (e.g.
// [6] -> [2,3] gives factors 2 and 3). A group without one ([4,6] -> [6,4]) is replicated.
std::optional<ShardingRule> Reshape(const ir::Node& node) {
  const Shape& a = node.input(0).type().shape;
  const Shape& b = node.output(0).shape;
  if (NumElements(a) == 0) return std::nullopt;
  ShardingRule rule;
  TensorFactors fa(a.size()), fb(b.size());
  size_t i = 0, j = 0;
  while (i < a.size() || j < b.size()) {
    if (i < a.size() && a[i] == 1) { ++i; continue; }
    if (j < b.size() && b[j] == 1) { ++j; continue; }
    if (i >= a.size() || j >= b.size()) return std::nullopt;
    std::vector<size_t> gi{i}, gj{j};
    int64_t pa = a[i], pb = b[j];
    while (pa != pb) {
      if (pa < pb) { ++i; pa *= a[i]; gi.push_back(i); }
      else { ++j; pb *= b[j]; gj.push_back(j); }
    }
    // Cumulative products of both sides; their union must form a divisibility chain.
    std::vector<int64_t> cuts;
    int64_t c = 1;
    for (size_t d : gi) cuts.push_back(c *= a[d]);
    c = 1;
    for (size_t d : gj) cuts.push_back(c *= b[d]);
    std::sort(cuts.begin(), cuts.end());
    cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
    bool chain = true;
    for (size_t k = 0, prev = 1; k < cuts.size(); prev = cuts[k++]) chain &= cuts[k] % prev == 0;
    if (chain) {
      std::vector<int> factors;
      int64_t prev = 1;
      for (int64_t cut : cuts) {
        factors.push_back(rule.AddFactor(cut / prev));
        prev = cut;
      }
      auto assign = [&](const Shape& shape, const std::vector<size_t>& group, TensorFactors& tf) {
        int64_t lo = 1;
        for (size_t d : group) {
          int64_t hi = lo * shape[d];
          for (size_t k = 0; k < cuts.size(); ++k)
            if (cuts[k] > lo && cuts[k] <= hi) tf[d].push_back(factors[k]);
          lo = hi;
        }
      };
      assign(a, gi, fa);
      assign(b, gj, fb);
    }
    ++i;
    ++j;
  }
  rule.operands = {fa};
  rule.results = {fb};
  return rule;
}

std::optional<ShardingRule> Permute(const ir::Node& node, std::vector<int64_t> perm) {
  ShardingRule rule;
  TensorFactors in = PassThroughFactors(rule, node.input(0).type());
  TensorFactors out;
  for (int64_t p : perm) out.push_back(in.at(WrapDim(p, in.size())));
  rule.operands = {in};
  rule.results = {out};
  return rule;
}

std::optional<ShardingRule> Transpose(const ir::Node& node) {
  int64_t rank = node.input(0).type().rank();
  std::vector<int64_t> perm(rank);
  for (int64_t d = 0; d < rank; ++d) perm[d] = d;
  if (rank >= 2) {
    int64_t d0 = node.op()->name == "aten::t_copy" ? 0 : Dim(node, "dim0", rank);
    int64_t d1 = node.op()->name == "aten::t_copy" ? 1 : Dim(node, "dim1", rank);
    std::swap(perm[d0], perm[d1]);
  }
  return Permute(node, perm);
}

std::optional<ShardingRule> Expand(const ir::Node& node) {
  ShardingRule rule;
  TensorFactors out = PassThroughFactors(rule, node.output(0));
  rule.operands = {BroadcastFactors(node.input(0).type(), node.output(0), out)};
  rule.results = {out};
  return rule;
}

// Maps the non-size-1 dims of the input and result in order (squeeze / unsqueeze).
std::optional<ShardingRule> SqueezeLike(const ir::Node& node) {
  const Shape& a = node.input(0).type().shape;
  const Shape& b = node.output(0).shape;
  ShardingRule rule;
  TensorFactors fa(a.size()), fb(b.size());
  size_t j = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i] == 1) continue;
    while (j < b.size() && b[j] == 1) ++j;
    if (j >= b.size() || b[j] != a[i]) return std::nullopt;
    int f = rule.AddFactor(a[i]);
    fa[i] = {f};
    fb[j++] = {f};
  }
  rule.operands = {fa};
  rule.results = {fb};
  return rule;
}

// One operand and results of the same rank; the listed dims get their own need-replication
// factors (their extent may differ between operand and result), the others pass through.
ShardingRule KeepDimsExcept(const TensorType& in, const std::vector<TensorType>& outs,
                            const std::vector<bool>& replicate) {
  ShardingRule rule;
  TensorFactors fin;
  std::vector<TensorFactors> fouts(outs.size());
  for (int64_t d = 0; d < in.rank(); ++d) {
    if (replicate[d]) {
      fin.push_back({rule.AddFactor(in.shape[d], FactorKind::kNeedReplication)});
      for (size_t o = 0; o < outs.size(); ++o)
        fouts[o].push_back({rule.AddFactor(outs[o].shape[d], FactorKind::kNeedReplication)});
      continue;
    }
    int f = rule.AddFactor(in.shape[d]);
    fin.push_back({f});
    for (auto& fo : fouts) fo.push_back({f});
  }
  rule.operands = {fin};
  rule.results = fouts;
  return rule;
}

std::vector<TensorType> Outputs(const ir::Node& n) { return n.outputs(); }

// Ops reading dims at absolute positions: those dims replicate (the rest pass through).
RuleBuilder Positional(std::function<std::vector<int64_t>(const ir::Node&, int64_t rank)> dims) {
  return [dims](const ir::Node& node) -> std::optional<ShardingRule> {
    const TensorType& in = node.input(0).type();
    for (const TensorType& t : node.outputs())
      if (t.rank() != in.rank()) return std::nullopt;
    std::vector<bool> replicate(in.rank(), false);
    if (in.rank() > 0)  // (a 0-dim tensor has no dim to keep whole; dim 0/-1 name it)
      for (int64_t d : dims(node, in.rank())) replicate[WrapDim(d, in.rank())] = true;
    ShardingRule rule = KeepDimsExcept(in, Outputs(node), replicate);
    for (size_t k = 1; k < node.inputs().size(); ++k)  // e.g. a second tensor of the same shape
      rule.operands.push_back(node.input(k).type().shape == in.shape ? rule.operands[0]
                                                                     : TensorFactors(node.input(k).type().rank()));
    return rule;
  };
}

std::vector<int64_t> DimArg(const ir::Node& n, int64_t rank) { return {Dim(n, "dim", rank)}; }
std::vector<int64_t> LastTwo(const ir::Node& n, int64_t rank) {
  return rank >= 2 ? std::vector<int64_t>{rank - 2, rank - 1} : std::vector<int64_t>{};
}
std::vector<int64_t> AllDims(const ir::Node& n, int64_t rank) {
  std::vector<int64_t> dims(rank);
  for (int64_t d = 0; d < rank; ++d) dims[d] = d;
  return dims;
}
// A slice's dim, unless every result keeps its whole extent: a full slice (x[:, 0:]; torch 2.6
// records Hugging Face's `hidden_states[:, slice(-0, None), :]` as one) is the identity.
std::vector<int64_t> SlicedDim(const ir::Node& n, int64_t rank) {
  const int64_t d = Dim(n, "dim", rank);
  for (const TensorType& t : n.outputs())
    if (t.shape[d] != n.input(0).type().shape[d]) return {d};
  return {};
}
// `inner` with ShardingRule::rows_of set for slice_copy(self, dim, start, end, step 1).
RuleBuilder WithRowsOf(RuleBuilder inner) {
  return [inner](const ir::Node& node) -> std::optional<ShardingRule> {
    std::optional<ShardingRule> rule = inner(node);
    const TensorType& in = node.input(0).type();
    if (!rule || in.rank() == 0 || IntArg(node, ArgIndex(node, "step"), 1) != 1) return rule;
    const int64_t d = Dim(node, "dim", in.rank()), n = in.shape[d];
    const int start_index = ArgIndex(node, "start");
    int64_t start = start_index < 0 || node.arg(start_index).is_none() ? 0 : node.arg(start_index).i;
    start = std::clamp<int64_t>(start < 0 ? start + n : start, 0, n);
    rule->algebra.rows_of = ShardingRule::Algebra::RowsOf{d, start, node.output(0).shape[d]};
    return rule;
  };
}
// constant_pad_nd's padded dims: pad = [left, right] per dim from the last one; dims padded by
// nothing keep their sharding (padding a sequence leaves the batch sharded).
std::vector<int64_t> PaddedDims(const ir::Node& n, int64_t rank) {
  const std::vector<int64_t> pad = IntListArg(n, ArgIndex(n, "pad"));
  std::vector<int64_t> dims;
  for (size_t i = 0; i + 1 < pad.size(); i += 2)
    if (pad[i] != 0 || pad[i + 1] != 0) dims.push_back(rank - 1 - static_cast<int64_t>(i / 2));
  return dims;
}

// select_copy(self, dim, index): the selected dim disappears.
std::optional<ShardingRule> Select(const ir::Node& node) {
  const TensorType& in = node.input(0).type();
  int64_t dim = Dim(node, "dim", in.rank());
  ShardingRule rule;
  TensorFactors fin, fout;
  for (int64_t d = 0; d < in.rank(); ++d) {
    if (d == dim) {
      fin.push_back({rule.AddFactor(in.shape[d], FactorKind::kNeedReplication)});
      continue;
    }
    int f = rule.AddFactor(in.shape[d]);
    fin.push_back({f});
    fout.push_back({f});
  }
  rule.operands = {fin};
  rule.results.assign(node.num_outputs(), fout);  // unbind: every result drops the dim
  return rule;
}

// cat(tensors, dim) / stack(tensors, dim): the joined dim replicates; other dims are shared.
// A cat onto empty tensors (a KV cache's first update: torch.cat([past, k], -2) with an empty
// past) is its one non-empty operand: the joined dim passes through it.
std::optional<ShardingRule> Join(const ir::Node& node, bool stack) {
  const TensorType& out = node.output(0);
  int64_t dim = Dim(node, "dim", out.rank());
  int whole = -1;  // a cat's one operand of non-zero extent along dim, if the rest are empty
  for (size_t i = 0; !stack && i < node.inputs().size(); ++i) {
    const TensorType& t = node.input(i).type();
    if (t.rank() == out.rank() && t.shape[dim] == out.shape[dim]) whole = static_cast<int>(i);
  }
  ShardingRule rule;
  TensorFactors fout;
  for (int64_t d = 0; d < out.rank(); ++d)
    fout.push_back({rule.AddFactor(out.shape[d], d == dim && whole < 0
                                                     ? FactorKind::kNeedReplication
                                                     : FactorKind::kPassThrough)});
  for (size_t i = 0; i < node.inputs().size(); ++i) {
    const TensorType& t = node.input(i).type();
    TensorFactors fin(t.rank());
    if (t.rank() + (stack ? 1 : 0) == out.rank()) {
      for (int64_t d = 0, od = 0; d < t.rank(); ++d, ++od) {
        if (stack && od == dim) ++od;
        if (od != dim) fin[d] = fout[od];
        else if (static_cast<int>(i) == whole) fin[d] = fout[od];
        else if (whole < 0) fin[d] = {rule.AddFactor(t.shape[d], FactorKind::kNeedReplication)};
      }
    }
    rule.operands.push_back(fin);
  }
  rule.results = {fout};
  return rule;
}

// slice_scatter(self, src, dim, ...) / select_scatter(self, src, dim, index): result = self with
// src written in; the written dim replicates.
std::optional<ShardingRule> ScatterInto(const ir::Node& node, bool select) {
  const TensorType& self = node.input(0).type();
  int64_t dim = Dim(node, "dim", self.rank());
  ShardingRule rule;
  TensorFactors fself, fsrc;
  for (int64_t d = 0; d < self.rank(); ++d) {
    if (d == dim) {
      fself.push_back({rule.AddFactor(self.shape[d], FactorKind::kNeedReplication)});
      if (!select)
        fsrc.push_back({rule.AddFactor(node.input(1).type().shape[d], FactorKind::kNeedReplication)});
      continue;
    }
    int f = rule.AddFactor(self.shape[d]);
    fself.push_back({f});
    fsrc.push_back({f});
  }
  rule.operands = {fself, fsrc};
  rule.results = {fself};
  return rule;
}

// select_backward(grad, input_sizes, dim, index) and slice_backward(grad, input_sizes, dim,
// start, end, step): zeros of input_sizes with grad written in along `dim`; that dim
// replicates, the others pass through, and input_sizes becomes the local shape.
std::optional<ShardingRule> IntoZeros(const ir::Node& node, bool select) {
  const TensorType& out = node.output(0);
  const TensorType& grad = node.input(0).type();
  int64_t dim = Dim(node, "dim", out.rank());
  ShardingRule rule;
  TensorFactors fout, fgrad;
  for (int64_t d = 0; d < out.rank(); ++d) {
    if (d == dim) {
      fout.push_back({rule.AddFactor(out.shape[d], FactorKind::kNeedReplication)});
      if (!select) fgrad.push_back({rule.AddFactor(grad.shape[d], FactorKind::kNeedReplication)});
      continue;
    }
    int f = rule.AddFactor(out.shape[d]);
    fout.push_back({f});
    fgrad.push_back({f});
  }
  rule.operands = {fgrad};
  rule.results = {fout};
  rule.lowering.local_args = LocalSizeArgs(ArgIndex(node, "input_sizes"));
  // Where grad lands (ShardingRule::into_zeros); not described for strided slices.
  const int64_t size = out.shape[dim];
  if (select) {
    const int64_t index = IntArg(node, ArgIndex(node, "index"));
    rule.algebra.into_zeros = ShardingRule::Algebra::IntoZeros{dim, index < 0 ? index + size : index, 1, true};
  } else if (IntArg(node, ArgIndex(node, "step"), 1) == 1) {
    int64_t start = IntArg(node, ArgIndex(node, "start"));
    start = std::clamp<int64_t>(start < 0 ? start + size : start, 0, size);
    rule.algebra.into_zeros = ShardingRule::Algebra::IntoZeros{dim, start, grad.shape[dim], false};
  }
  return rule;
}

}  // namespace

void RegisterViewRules() {
  // Every op here moves elements by position along its positional dims and keeps the others
  // independent: none reads the extents of the dims its devices' rows may merge into.
  // Zeros with grad written in are linear in grad: a pending sum passes where the result is
  // no larger (a select of a size-1 dim, such as a pipeline's stacked weights per iteration).
  RegisterRule("aten::select_backward",
               ReadsNoExtents(LinearIn([](const ir::Node& n) { return IntoZeros(n, true); })));
  RegisterRule("aten::slice_backward",
               ReadsNoExtents(LinearIn([](const ir::Node& n) { return IntoZeros(n, false); })));
  // Views, permutations, slices and position-wise copies are linear: pending partial sums pass
  // through them (LinearIn). The *_copy ops of the functional IR are views in the program the
  // user wrote (AsView: they cost no time), each of a kind (ViewKind) the executor may alias.
  // view and _unsafe_view must be expressible on their operand's strides (ReadsStrides).
  RegisterRules({"aten::view_copy", "aten::_unsafe_view"},
                ReadsStrides(ReadsNoExtents(
                    AsView(LinearIn(WithLocalSize(Reshape, "size")), ViewKind::kReshape))));
  RegisterRule("aten::reshape", ReadsNoExtents(AsView(LinearIn(WithLocalSize(Reshape, "size")),
                                                      ViewKind::kReshape)));
  // (The recorder records _reshape_alias as view_copy; its explicit strides are not a
  // row-major reshape in general.)
  RegisterRule("aten::_reshape_alias_copy",
               ReadsStrides(ReadsNoExtents(
                   AsView(LinearIn(WithLocalSize(Reshape, "size")), ViewKind::kOther))));
  RegisterRule("aten::permute_copy", ReadsNoExtents(AsView(LinearIn([](const ir::Node& n) {
    return Permute(n, IntListArg(n, ArgIndex(n, "dims")));
  }), ViewKind::kPermute)));
  RegisterRules({"aten::transpose_copy", "aten::t_copy"},
                ReadsNoExtents(AsView(LinearIn(Transpose), ViewKind::kPermute)));
  RegisterRule("aten::expand_copy",
               ReadsNoExtents(AsView(WithLocalSize(Expand, "size"), ViewKind::kReshape)));
  RegisterRules({"aten::squeeze_copy", "aten::unsqueeze_copy"},
                ReadsNoExtents(AsView(LinearIn(SqueezeLike), ViewKind::kReshape)));
  RegisterRules({"aten::select_copy", "aten::unbind_copy"},
                ReadsNoExtents(AsView(LinearIn(Select), ViewKind::kSubset)));
  RegisterRule("aten::cat", WithForm(Joins(Additive(ReadsNoExtents(
                                         [](const ir::Node& n) { return Join(n, false); }))),
                                     ShardingRule::Algebra::Form::kConcatenation));
  RegisterRule("aten::stack",
               Joins(Additive(ReadsNoExtents([](const ir::Node& n) { return Join(n, true); }))));
  RegisterRule("aten::slice_scatter",
               ReadsNoExtents([](const ir::Node& n) { return ScatterInto(n, false); }));
  RegisterRule("aten::select_scatter",
               ReadsNoExtents([](const ir::Node& n) { return ScatterInto(n, true); }));
  RegisterRules({"aten::split_copy", "aten::split_with_sizes_copy", "aten::narrow_copy"},
                ReadsNoExtents(AsView(LinearIn(Positional(SlicedDim)), ViewKind::kReshape)));
  RegisterRule("aten::slice_copy", WithRowsOf(ReadsNoExtents(
                                       AsView(LinearIn(Positional(SlicedDim)), ViewKind::kSubset))));
  RegisterRule("aten::cumsum", ReadsNoExtents(LinearIn(Positional(DimArg))));
  // _safe_softmax: softmax with fully masked rows zero (scaled_dot_product_attention's math
  // path, torch >= 2.5).
  // (_softmax and _log_softmax: softmax.cc.)
  RegisterRules({"aten::cumprod", "aten::sort", "aten::topk", "aten::_safe_softmax"},
                ReadsNoExtents(Positional(DimArg)));
  // (flip and roll: shift.cc.)
  RegisterRules({"aten::tril", "aten::triu"}, ReadsNoExtents(LinearIn(Positional(LastTwo))));
  RegisterRule("aten::constant_pad_nd",
               WithForm(ReadsNoExtents(Joins(Positional(PaddedDims))),
                        ShardingRule::Algebra::Form::kConstantPad));
  RegisterRule("aten::repeat", ReadsNoExtents(Positional(AllDims)));
}

}  // namespace spmd::partition
