#include "partition/simplify.h"

#include <algorithm>
#include <optional>
#include <unordered_map>

#include "core/metrics.h"
#include "partition/rules/rule.h"

namespace spmd::partition {

namespace {

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
  std::optional<ShardingRule> rule = GetRule(n);
  if (!rule || !rule->into_zeros || n.num_outputs() != 1) return std::nullopt;
  const ShardingRule::IntoZeros& z = *rule->into_zeros;
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
      ir::NodePtr out = Rewrite(*n, replaced);
      if (!out) out = WithNewInputs(n, replaced);
      if (out != n) replaced[n.get()] = out;
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
    if (n.op()->qualified != "aten::add.Tensor") return IntoZeros(n);
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
    if (n.op()->qualified == "aten::cat") return RollOfSwappedHalves(n, replaced);
    return JoinedGradients(n, replaced);
  }

  // v's source through slices that keep a whole dim (torch 2.6 records x[:, a:] as a slice of
  // all of dim 0, then the slice of dim 1).
  static ir::Value ThroughWholeSlices(ir::Value v) {
    while (v.index == 0 && v.node->num_outputs() == 1 && !v.node->inputs().empty()) {
      std::optional<ShardingRule> rule = GetRule(*v.node);
      const ir::Value& in = v.node->input(0);
      if (!rule || !rule->rows_of || in.type() != v.type()) break;
      v = in;
    }
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
    std::optional<ShardingRule::RowsOf> rows[2];
    for (int i = 0; i < 2; ++i) {
      const ir::Value& in = n.input(i);
      if (in.index != 0 || in.node->num_outputs() != 1 || in.node->inputs().empty()) return nullptr;
      std::optional<ShardingRule> rule = GetRule(*in.node);
      if (!rule || !rule->rows_of || rule->rows_of->dim != d) return nullptr;
      rows[i] = rule->rows_of;
    }
    const ir::Value x = ThroughWholeSlices(n.input(0).node->input(0));
    const ir::Value y = ThroughWholeSlices(n.input(1).node->input(0));
    if (x.node != y.node || x.index != y.index || x.type() != out) return nullptr;
    const int64_t size = out.shape[d], a = rows[1]->length;
    if (rows[1]->start != 0 || rows[0]->start != a || rows[0]->length != size - a || a == 0 ||
        a == size)
      return nullptr;
    const ir::OpInfo* op = ir::InternOp("aten::roll",
                                        {{"self", ir::ArgType::kTensor},
                                         {"shifts", ir::ArgType::kIntList},
                                         {"dims", ir::ArgType::kIntList}},
                                        1);
    ir::NodePtr roll = ir::MakeNode(op, {Remap(x, replaced)},
                                    {ir::Arg::Tensor(0), ir::Arg::IntList({size - a}),
                                     ir::Arg::IntList({d})},
                                    {out});
    roll->set_scope(n.scope());
    roll->set_in_backward(n.in_backward());
    Count("RollsFromSlices");
    return roll;
  }

  // A stack or cat of the gradients when `n` sums pieces that cover their whole dim.
  ir::NodePtr JoinedGradients(const ir::Node& n,
                              const std::unordered_map<const ir::Node*, ir::NodePtr>& replaced) {
    if (n.op()->qualified != "aten::add.Tensor") return nullptr;
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
  std::unordered_map<const ir::Node*, int> uses_;
  std::unordered_map<const ir::Node*, std::optional<ZerosSum>> sums_;
};

}  // namespace

ir::Graph SimplifyGraph(const ir::Graph& graph) { return Simplifier(graph).Run(); }

}  // namespace spmd::partition
