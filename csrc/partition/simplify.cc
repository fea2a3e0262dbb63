#include "partition/simplify.h"

#include <algorithm>
#include <optional>
#include <unordered_map>

#include "core/hash.h"
#include "core/metrics.h"
#include "partition/rules/rule.h"

namespace spmd::partition {

namespace {

using Form = ShardingRule::Algebra::Form;

// The identity the op's rule says it is (ShardingRule::Algebra::form), if any.
Form FormOf(const ir::Node& n) {
  RulePtr rule = GetRule(n);
  return rule ? rule->algebra.form : Form::kNone;
}

// One gradient written into zeros: it fills [start, start + length) of the result's `dim`.
struct Piece {
  ir::Value grad;
  int64_t start = 0;
  int64_t length = 0;
};

// A sum of such gradients, all into zeros of one type along one dim.
struct ZerosSum {
  bool stacked = false;  // pieces of length 1 whose grads lack the dim (joined by stack)
  int64_t dim = 0;
  TensorType type;
  std::vector<Piece> pieces;
};

// A gradient written into zeros (its rule's into_zeros) as a one-piece sum.
std::optional<ZerosSum> IntoZeros(const ir::Node& n) {
  RulePtr rule = GetRule(n);
  if (!rule || !rule->algebra.into_zeros || n.num_outputs() != 1) return std::nullopt;
  const ShardingRule::Algebra::IntoZeros& z = *rule->algebra.into_zeros;
  ZerosSum sum{z.stacked, z.dim, n.output(0), {}};
  if (n.input(0).type().dtype != sum.type.dtype || z.start < 0 ||
      z.start + z.length > sum.type.shape[z.dim])
    return std::nullopt;
  sum.pieces.push_back(Piece{n.input(0), z.start, z.length});
  return sum;
}

bool IsUnitScalar(const ir::Arg& a) { return a.is_scalar() && !a.dynamic && a.ScalarValue() == 1.0; }

class Simplifier {
 public:
  explicit Simplifier(const ir::Graph& graph) : graph_(graph) {
    for (const ir::NodePtr& n : graph.nodes)
      for (const ir::Value& in : n->inputs()) ++uses_[in.node.get()];
    for (const ir::Value& out : graph.outputs) ++uses_[out.node.get()];
  }

  ir::Graph Run() {
    std::unordered_map<const ir::Node*, ir::NodePtr> replaced;
    std::vector<ir::NodePtr> nodes;
    nodes.reserve(graph_.nodes.size());
    for (const ir::NodePtr& n : graph_.nodes) {
      if (const ir::NodePtr same = EarlierSameView(*n, replaced)) {
        replaced[n.get()] = same;
        continue;
      }
      ir::NodePtr out = Rewrite(*n, replaced);
      for (ir::NodePtr& e : extra_) nodes.push_back(std::move(e));  // (new nodes it reads)
      extra_.clear();
      if (!out) out = WithNewInputs(n, replaced);
      if (out != n) replaced[n.get()] = out;
      NoteView(out);
      nodes.push_back(out);
    }
    if (replaced.empty()) return graph_;
    ir::Graph g;
    g.params = graph_.params;
    g.scalars = graph_.scalars;
    g.key = graph_.key;
    for (const ir::Value& out : graph_.outputs) g.outputs.push_back(Remap(out, replaced));
    // Keep what the new outputs still reach, in the original post-order.
    std::unordered_map<const ir::Node*, bool> live;
    for (const ir::Value& out : g.outputs) live[out.node.get()] = true;
    for (const ir::NodePtr& p : g.params) live[p.get()] = true;
    for (auto it = nodes.rbegin(); it != nodes.rend(); ++it) {
      if (!live.count(it->get())) continue;
      for (const ir::Value& in : (*it)->inputs()) live[in.node.get()] = true;
    }
    for (ir::NodePtr& n : nodes) {
      if (!live.count(n.get())) continue;
      g.position[n.get()] = static_cast<int>(g.nodes.size());
      g.nodes.push_back(std::move(n));
    }
    return g;
  }

 private:
  // Views (ShardingRule::view) are pure and hold no memory, so two views of one value with the
  // same op and arguments are one value, as XLA's CSE makes them: each F.linear of q, k and v
  // reshapes the same activation, and the partitioner then moves it once (its reshard cache
  // is keyed by value), not once per projection. Only views with no run-time scalars (the
  // partitioner numbers those node by node), and only within a phase: a backward view merged
  // into its forward twin would read the viewed value where the backward does (a gathered
  // copy's reuse across phases, an offloaded value kept in device memory).
  static bool IsPlainView(const ir::Node& n) {
    if (n.inputs().empty() || n.num_outputs() != 1) return false;
    for (const ir::Arg& a : n.args())
      if (a.num_slots() != 0) return false;
    RulePtr rule = GetRule(n);
    return rule && rule->executor.view != ViewKind::kNone;
  }

  static Hash ViewKey(const ir::Node& n, const std::vector<ir::Value>& inputs) {
    Hash h = HashCombine(HashInt(reinterpret_cast<intptr_t>(n.op())), HashInt(static_cast<int64_t>(inputs.size())));
    for (const ir::Value& in : inputs)
      h = HashCombine(h, HashCombine(HashInt(reinterpret_cast<intptr_t>(in.node.get())), HashInt(in.index)));
    for (const ir::Arg& a : n.args()) h = HashCombine(h, a.hash());
    return h;
  }

  static std::vector<ir::Value> RemappedInputs(
      const ir::Node& n, const std::unordered_map<const ir::Node*, ir::NodePtr>& replaced) {
    std::vector<ir::Value> inputs;
    for (const ir::Value& in : n.inputs()) inputs.push_back(Remap(in, replaced));
    return inputs;
  }

  // An earlier view equal to `n` (on its inputs' replacements), or nullptr.
  ir::NodePtr EarlierSameView(const ir::Node& n,
                              const std::unordered_map<const ir::Node*, ir::NodePtr>& replaced) {
    if (!IsPlainView(n)) return nullptr;
    const std::vector<ir::Value> inputs = RemappedInputs(n, replaced);
    auto range = views_.equal_range(ViewKey(n, inputs));
    for (auto it = range.first; it != range.second; ++it) {
      const ir::Node& m = *it->second;
      if (m.op() != n.op() || m.args() != n.args() || m.outputs() != n.outputs() ||
          m.inputs().size() != inputs.size() || m.in_backward() != n.in_backward())
        continue;
      bool same = true;
      for (size_t i = 0; i < inputs.size() && same; ++i)
        same = m.input(i).node == inputs[i].node && m.input(i).index == inputs[i].index;
      if (same) {
        Count("SharedViews");
        return it->second;
      }
    }
    return nullptr;
  }

  void NoteView(const ir::NodePtr& n) {
    if (IsPlainView(*n)) views_.emplace(ViewKey(*n, n->inputs()), n);
  }

  static ir::Value Remap(const ir::Value& v,
                        const std::unordered_map<const ir::Node*, ir::NodePtr>& replaced) {
    auto it = replaced.find(v.node.get());
    return it == replaced.end() ? v : ir::Value{it->second, v.index};
  }

  // `n` itself, or a copy reading the replacements of its inputs.
  static ir::NodePtr WithNewInputs(const ir::NodePtr& n,
                                   const std::unordered_map<const ir::Node*, ir::NodePtr>& replaced) {
    bool changed = false;
    std::vector<ir::Value> inputs;
    inputs.reserve(n->inputs().size());
    for (const ir::Value& in : n->inputs()) {
      inputs.push_back(Remap(in, replaced));
      changed |= inputs.back().node != in.node;
    }
    if (!changed) return n;
    ir::NodePtr copy = ir::MakeNode(n->op(), std::move(inputs), n->args(), n->outputs());
    copy->set_shardings(n->shardings());
    copy->set_scope(n->scope());
    copy->set_in_backward(n->in_backward());
    return copy;
  }

  // The pieces of a value that only its one user reads: a gradient into zeros, or an add
  // (alpha 1, no type promotion) of two such sums along the same dim that do not overlap.
  std::optional<ZerosSum> Collect(const ir::Value& v) {
    const ir::Node& n = *v.node;
    if (v.index != 0 || uses_[&n] != 1) return std::nullopt;
    return Sum(n);  // a copy: the caller extends it
  }

  // Sums are memoized: an add chain is met once per add, and each reads the one before.
  const std::optional<ZerosSum>& Sum(const ir::Node& n) {
    auto it = sums_.find(&n);
    if (it == sums_.end()) it = sums_.emplace(&n, ComputeSum(n)).first;
    return it->second;
  }

  std::optional<ZerosSum> ComputeSum(const ir::Node& n) {
    if (FormOf(n) != Form::kSum) return IntoZeros(n);
    const int alpha = ArgIndex(n, "alpha");
    if (alpha < 0 || !IsUnitScalar(n.arg(alpha))) return std::nullopt;
    std::optional<ZerosSum> a = Collect(n.input(0));
    if (!a) return std::nullopt;
    std::optional<ZerosSum> b = Collect(n.input(1));
    if (!b || a->stacked != b->stacked || a->dim != b->dim || a->type != n.output(0) ||
        b->type != n.output(0))
      return std::nullopt;
    for (const Piece& p : b->pieces) {
      for (const Piece& q : a->pieces)
        if (p.start < q.start + q.length && q.start < p.start + p.length) return std::nullopt;
      a->pieces.push_back(p);
    }
    return a;
  }

  ir::NodePtr Rewrite(const ir::Node& n,
                      const std::unordered_map<const ir::Node*, ir::NodePtr>& replaced) {
    switch (FormOf(n)) {
      case Form::kConcatenation: return RollOfSwappedHalves(n, replaced);
      case Form::kConstantPad: return FilledShift(n, replaced);
      case Form::kSum: return JoinedGradients(n, replaced);
      case Form::kNone: return nullptr;
    }
    return nullptr;
  }

  // A new node for a rewrite of `like`, carrying its scope and phase.
  static ir::NodePtr Make(const ir::Node& like, const char* op, std::vector<ir::ArgSchema> schema,
                          std::vector<ir::Value> inputs, std::vector<ir::Arg> args,
                          TensorType out) {
    const ir::OpInfo* info = ir::InternOp(op, std::move(schema), 1);
    ir::NodePtr node = ir::MakeNode(info, std::move(inputs), std::move(args), {std::move(out)});
    node->set_scope(like.scope());
    node->set_in_backward(like.in_backward());
    return node;
  }

  // Make, for a node that the one replacing `like` reads: `extra_` puts it in the graph first.
  ir::NodePtr Emit(const ir::Node& like, const char* op, std::vector<ir::ArgSchema> schema,
                   std::vector<ir::Value> inputs, std::vector<ir::Arg> args, TensorType out) {
    ir::NodePtr node =
        Make(like, op, std::move(schema), std::move(inputs), std::move(args), std::move(out));
    extra_.push_back(node);
    return node;
  }

  // torch.roll(x, shift, d), as large as `like`'s result.
  static ir::NodePtr Roll(const ir::Node& like, const ir::Value& x, int64_t shift, int64_t d) {
    return Make(like, "aten::roll",
                {{"self", ir::ArgType::kTensor}, {"shifts", ir::ArgType::kIntList},
                 {"dims", ir::ArgType::kIntList}},
                {x}, {ir::Arg::Tensor(0), ir::Arg::IntList({shift}), ir::Arg::IntList({d})},
                like.output(0));
  }

  // The rows of a source tensor that single-output `v` is (a slice's ShardingRule::rows_of).
  static std::optional<ShardingRule::Algebra::RowsOf> SlicedRows(const ir::Value& v) {
    if (v.index != 0 || v.node->num_outputs() != 1 || v.node->inputs().empty())
      return std::nullopt;
    RulePtr rule = GetRule(*v.node);
    return rule ? rule->algebra.rows_of : std::nullopt;
  }

  // F.pad(x[a:a + len], (p, q)) along d, as large as x (a shift that fills with the pad
  // value, torch.cat([zeros, x[:-s]])'s twin) is where(p <= i < p + len, roll(x, p - a, d),
  // value): the roll stays sharded, the mask is a replicated vector of the dim's length.
  ir::NodePtr FilledShift(const ir::Node& n,
                          const std::unordered_map<const ir::Node*, ir::NodePtr>& replaced) {
    if (n.inputs().size() != 1 || n.num_outputs() != 1) return nullptr;
    const std::optional<ShardingRule::Algebra::RowsOf> rows = SlicedRows(n.input(0));
    if (!rows) return nullptr;
    const TensorType& out = n.output(0);
    const int64_t d = rows->dim, a = rows->start, len = rows->length;
    const ir::Value x = ThroughWholeSlices(n.input(0).node->input(0));
    if (x.type() != out) return nullptr;
    // The pad list holds (before, after) per dim from the last one: only d's may be non-zero.
    const int pad_index = ArgIndex(n, "pad"), value_index = ArgIndex(n, "value");
    if (pad_index < 0) return nullptr;
    const std::vector<int64_t> pad = IntListArg(n, pad_index);
    int64_t p = 0, q = 0;
    for (size_t i = 0; i + 1 < pad.size(); i += 2) {
      const int64_t dim = out.rank() - 1 - static_cast<int64_t>(i / 2);
      if (dim == d) {
        p = pad[i];
        q = pad[i + 1];
      } else if (pad[i] != 0 || pad[i + 1] != 0) {
        return nullptr;
      }
    }
    const int64_t size = out.shape[d];
    if (p < 0 || q < 0 || len == 0 || p + len + q != size || p + q == 0) return nullptr;
    ir::Arg value = value_index >= 0 ? n.arg(value_index) : ir::Arg::ScalarInt(0);
    if (value.is_none()) value = ir::Arg::ScalarInt(0);
    // A run-time value stays a run-time value: the where takes the pad's place in the graph,
    // and with it the pad's place in the order of run-time scalars (the new nodes before it
    // have constant scalars only).
    if (!value.is_scalar()) return nullptr;

    using ir::Arg;
    using ir::ArgType;
    ir::NodePtr roll = Roll(n, Remap(x, replaced), p - a, d);
    extra_.push_back(roll);
    const TensorType index{DType::kInt64, {size}}, flags{DType::kBool, {size}};
    ir::NodePtr i = Emit(n, "aten::arange.start_step",
                         {{"start", ArgType::kScalar}, {"end", ArgType::kScalar},
                          {"step", ArgType::kScalar}, {"dtype", ArgType::kScalarType, true},
                          {"layout", ArgType::kLayout, true}, {"device", ArgType::kDevice, true},
                          {"pin_memory", ArgType::kBool, true}},
                         {}, {Arg::ScalarInt(0), Arg::ScalarInt(size), Arg::ScalarInt(1), Arg::None(),
                              Arg::None(), Arg::None(), Arg::None()},
                         index);
    const std::vector<ir::ArgSchema> compare = {{"self", ArgType::kTensor},
                                                {"other", ArgType::kScalar}};
    ir::NodePtr from = Emit(n, "aten::ge.Scalar", compare, {{i, 0}},
                            {Arg::Tensor(0), Arg::ScalarInt(p)}, flags);
    ir::NodePtr to = Emit(n, "aten::lt.Scalar", compare, {{i, 0}},
                          {Arg::Tensor(0), Arg::ScalarInt(p + len)}, flags);
    ir::NodePtr keep = Emit(n, "aten::logical_and",
                            {{"self", ArgType::kTensor}, {"other", ArgType::kTensor}},
                            {{from, 0}, {to, 0}}, {Arg::Tensor(0), Arg::Tensor(1)}, flags);
    Shape along(out.rank(), 1);
    along[d] = size;
    ir::NodePtr mask = Emit(n, "aten::view_copy",
                            {{"self", ArgType::kTensor}, {"size", ArgType::kIntList}},
                            {{keep, 0}}, {Arg::Tensor(0), Arg::IntList(along)},
                            TensorType{DType::kBool, along});
    Count("FilledShiftsFromSlices");
    return Make(n, "aten::where.ScalarOther",
                {{"condition", ArgType::kTensor}, {"self", ArgType::kTensor},
                 {"other", ArgType::kScalar}},
                {{mask, 0}, {roll, 0}}, {Arg::Tensor(0), Arg::Tensor(1), value}, out);
  }

  // v's source through slices that keep a whole dim (torch 2.6 records x[:, a:] as a slice of
  // all of dim 0, then the slice of dim 1).
  static ir::Value ThroughWholeSlices(ir::Value v) {
    while (SlicedRows(v) && v.node->input(0).type() == v.type()) v = v.node->input(0);
    return v;
  }

  // torch.cat([x[a:], x[:a]], d) is torch.roll(x, -a, d): a shift written with slices, which
  // would gather a sharded dim, becomes one the roll's rule keeps sharded (rules/shift.cc).
  ir::NodePtr RollOfSwappedHalves(const ir::Node& n,
                                  const std::unordered_map<const ir::Node*, ir::NodePtr>& replaced) {
    if (n.inputs().size() != 2 || n.num_outputs() != 1) return nullptr;
    const TensorType& out = n.output(0);
    if (out.rank() == 0) return nullptr;
    const int64_t d = WrapDim(IntArg(n, ArgIndex(n, "dim")), out.rank());
    std::optional<ShardingRule::Algebra::RowsOf> rows[2];
    for (int i = 0; i < 2; ++i) {
      rows[i] = SlicedRows(n.input(i));
      if (!rows[i] || rows[i]->dim != d) return nullptr;
    }
    const ir::Value x = ThroughWholeSlices(n.input(0).node->input(0));
    const ir::Value y = ThroughWholeSlices(n.input(1).node->input(0));
    if (x.node != y.node || x.index != y.index || x.type() != out) return nullptr;
    const int64_t size = out.shape[d], a = rows[1]->length;
    if (rows[1]->start != 0 || rows[0]->start != a || rows[0]->length != size - a || a == 0 ||
        a == size)
      return nullptr;
    Count("RollsFromSlices");
    return Roll(n, Remap(x, replaced), size - a, d);
  }

  // A stack or cat of the gradients when `n`, a sum (Form::kSum), adds pieces that cover their
  // whole dim.
  ir::NodePtr JoinedGradients(const ir::Node& n,
                              const std::unordered_map<const ir::Node*, ir::NodePtr>& replaced) {
    std::optional<ZerosSum> sum = Sum(n);  // a copy: sorted below
    if (!sum) return nullptr;
    int64_t covered = 0;
    for (const Piece& p : sum->pieces) covered += p.length;
    if (covered != sum->type.shape[sum->dim]) return nullptr;  // disjoint: covered == size
    std::sort(sum->pieces.begin(), sum->pieces.end(),
              [](const Piece& x, const Piece& y) { return x.start < y.start; });
    std::vector<ir::Value> grads;
    ir::Arg list;
    list.kind = ir::Arg::Kind::kTensorList;
    for (const Piece& p : sum->pieces) {
      list.ints.push_back(static_cast<int64_t>(grads.size()));
      grads.push_back(Remap(p.grad, replaced));  // an earlier layer's rewrite feeds it
    }
    const ir::OpInfo* op = ir::InternOp(sum->stacked ? "aten::stack" : "aten::cat",
                                        {{"tensors", ir::ArgType::kTensorList},
                                         {"dim", ir::ArgType::kInt}},
                                        1);
    ir::NodePtr out = ir::MakeNode(op, std::move(grads), {list, ir::Arg::Int(sum->dim)},
                                   {sum->type});
    out->set_scope(n.scope());
    out->set_in_backward(n.in_backward());
    Count("JoinedGradientSums");
    return out;
  }

  const ir::Graph& graph_;
  std::vector<ir::NodePtr> extra_;  // nodes a rewrite made, for Run to place before its result
  std::unordered_map<const ir::Node*, int> uses_;
  std::unordered_map<const ir::Node*, std::optional<ZerosSum>> sums_;
  std::unordered_multimap<Hash, ir::NodePtr> views_;  // the graph's views so far, by ViewKey
};

}  // namespace

ir::Graph SimplifyGraph(const ir::Graph& graph) { return Simplifier(graph).Run(); }

}  // namespace spmd::partition
