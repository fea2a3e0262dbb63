// Advanced indexing: index.Tensor (`x[idx]`, `x[:, i, j]`) and index_put (`x[idx] = v`, and
// with accumulate=True the backward of index). The index tensors broadcast together to a
// shape B, which replaces the indexed dims of self in the result: where the first indexed dim
// was when the indexed dims are adjacent, in front otherwise (numpy's rule).
//
//   index(self [E, F, D], [ids [S]])      -> [S, F, D]   E replicates, S/F/D pass through
//   index_put(self [E, F, D], [ids [S]], values [S, F, D]) -> [E, F, D]
//
// The indexed dims of self are read or written at data-dependent positions: they replicate.
// For index, B's dims pass through from the index tensors to the result (a token's expert
// weights, gathered on the device that holds the token): a Mixture-of-Experts layer's
// `weights[expert_ids]` keeps the token dim sharded. For index_put B's dims replicate (every
// device must write every position it holds) unless it accumulates floating values, where
// they are a sum (IndexPut); the other dims of self and values pass through. Boolean masks
// (data-dependent result shapes) have no rule.
#include "partition/local_builder.h"
#include "partition/rules/all_rules.h"
#include "partition/rules/rule.h"

namespace spmd::partition {

namespace {

struct IndexGeometry {
  std::vector<int> index_input;  // per self dim: the node input indexing it, or -1
  std::vector<int> indices;      // the node inputs of the index tensors, in order
  Shape broadcast;               // B
  int64_t insert_at = 0;         // where B's dims go among the result dims
};

std::optional<IndexGeometry> GeometryOf(const ir::Node& node) {
  const int a = ArgIndex(node, "indices");
  if (a < 0 || node.arg(a).kind != ir::Arg::Kind::kOptTensorList) return std::nullopt;
  const TensorType& self = node.input(0).type();
  const std::vector<int64_t>& list = node.arg(a).ints;
  if (list.empty() || static_cast<int64_t>(list.size()) > self.rank()) return std::nullopt;
  IndexGeometry g;
  g.index_input.assign(self.rank(), -1);
  int64_t first = -1, last = -1;
  for (size_t d = 0; d < list.size(); ++d) {
    if (list[d] < 0) continue;
    const TensorType& t = node.input(list[d]).type();
    if (t.dtype == DType::kBool || t.dtype == DType::kUInt8) return std::nullopt;  // masks
    g.index_input[d] = static_cast<int>(list[d]);
    g.indices.push_back(static_cast<int>(list[d]));
    if (first < 0) first = static_cast<int64_t>(d);
    last = static_cast<int64_t>(d);
    // Broadcast B with t, right-aligned.
    Shape b = g.broadcast.size() >= t.shape.size() ? g.broadcast : t.shape;
    const Shape& other = g.broadcast.size() >= t.shape.size() ? t.shape : g.broadcast;
    for (size_t i = 0; i < other.size(); ++i) {
      int64_t& bd = b[b.size() - other.size() + i];
      const int64_t od = other[i];
      if (bd == 1) bd = od;
      else if (od != 1 && od != bd) return std::nullopt;
    }
    g.broadcast = b;
  }
  if (first < 0) return std::nullopt;
  bool adjacent = true;
  for (int64_t d = first; d <= last; ++d) adjacent = adjacent && g.index_input[d] >= 0;
  g.insert_at = adjacent ? first : 0;
  return g;
}

// The factors of self, of B and of the indexed result (self's dims with the indexed ones
// replaced by B's), with `b_kind` for B's factors.
struct IndexFactors {
  TensorFactors self, broadcast, result;
};

IndexFactors FactorsOf(ShardingRule& rule, const IndexGeometry& g, const TensorType& self,
                       FactorKind b_kind) {
  IndexFactors f;
  for (int64_t b : g.broadcast) {
    int factor = rule.AddFactor(b, b_kind);
    rule.factors[factor].always_mask = true;  // index padding reads position 0, in range
    f.broadcast.push_back({factor});
  }
  TensorFactors kept;  // self's non-indexed dims, in order
  for (int64_t d = 0; d < self.rank(); ++d) {
    if (g.index_input[d] >= 0) {
      f.self.push_back({rule.AddFactor(self.shape[d], FactorKind::kNeedReplication)});
      continue;
    }
    f.self.push_back({rule.AddFactor(self.shape[d])});
    kept.push_back(f.self.back());
  }
  f.result.assign(kept.begin(), kept.begin() + std::min<int64_t>(g.insert_at, kept.size()));
  f.result.insert(f.result.end(), f.broadcast.begin(), f.broadcast.end());
  f.result.insert(f.result.end(), kept.begin() + std::min<int64_t>(g.insert_at, kept.size()),
                  kept.end());
  return f;
}

// The shape a tensor made of `factors` (one factor per dim) has: the indexed result's.
Shape ShapeOf(const ShardingRule& rule, const TensorFactors& factors) {
  Shape shape;
  for (const DimFactors& d : factors) shape.push_back(rule.factors[d[0]].size);
  return shape;
}

// Every input's factors: self, the index tensors onto B, `values` (input or -1) onto the
// indexed result.
std::vector<TensorFactors> OperandFactors(const ir::Node& node, const ShardingRule& rule,
                                          const IndexGeometry& g, const IndexFactors& f,
                                          int values) {
  std::vector<TensorFactors> operands(node.inputs().size());
  operands[0] = f.self;
  const TensorType b{DType::kInt64, g.broadcast};
  for (int i : g.indices) operands[i] = BroadcastFactors(node.input(i).type(), b, f.broadcast);
  if (values >= 0)
    operands[values] = BroadcastFactors(
        node.input(values).type(), TensorType{DType::kInt64, ShapeOf(rule, f.result)}, f.result);
  return operands;
}

std::optional<ShardingRule> Index(const ir::Node& node) {
  std::optional<IndexGeometry> g = GeometryOf(node);
  if (!g) return std::nullopt;
  ShardingRule rule;
  rule.executor.reads_extents = false;  // dims other than the indexed ones are independent
  IndexFactors f = FactorsOf(rule, *g, node.input(0).type(), FactorKind::kPassThrough);
  if (node.output(0).shape != ShapeOf(rule, f.result)) return std::nullopt;
  rule.operands = OperandFactors(node, rule, *g, f, -1);
  rule.results = {f.result};
  return rule;
}

std::optional<ShardingRule> IndexPut(const ir::Node& node) {
  std::optional<IndexGeometry> g = GeometryOf(node);
  const int values = InputOfArg(node, "values");
  if (!g || values < 0 || node.output(0).shape != node.input(0).type().shape) return std::nullopt;
  // Accumulating floating values, B's dims are a sum: each device adds the values it holds,
  // leaving a partial sum (an MoE layer's expert-weight gradient is reduce-scattered onto the
  // weight's shards instead of every token's gradient being gathered). Self is added once:
  // each of the n members of the group adds self / n (addmm's bias, matmul.cc).
  const bool sums = BoolArg(node, ArgIndex(node, "accumulate")) &&
                    IsFloatingPoint(node.output(0).dtype);
  ShardingRule rule;
  rule.executor.reads_extents = false;  // dims other than the indexed ones are independent
  IndexFactors f = FactorsOf(rule, *g, node.input(0).type(),
                             sums ? FactorKind::kReduction : FactorKind::kNeedReplication);
  rule.operands = OperandFactors(node, rule, *g, f, values);
  rule.results = {f.self};
  if (!sums) return rule;
  std::vector<int> b_factors;
  for (const DimFactors& d : f.broadcast) b_factors.push_back(d[0]);
  rule.lowering.lower = [b_factors](LocalBuilder& b, const std::vector<LocalValue>& ops) {
    AxisList axes;
    for (int factor : b_factors)
      axes.insert(axes.end(), b.factor_axes()[factor].begin(), b.factor_axes()[factor].end());
    if (axes.empty()) return b.EmitNodeOp(ops);
    std::vector<LocalValue> shared = ops;
    shared[0] = b.EmitOp("aten::mul.Scalar",
                         {{"self", ir::ArgType::kTensor}, {"other", ir::ArgType::kScalar}},
                         {ops[0].value},
                         {ir::Arg::Tensor(0),
                          ir::Arg::ScalarDouble(1.0 / static_cast<double>(AxesSize(b.mesh(), axes)))},
                         ops[0].value.type(), ops[0].layout, ops[0].global);
    return b.EmitNodeOp(shared);
  };
  return rule;
}

}  // namespace

void RegisterAdvancedIndexRules() {
  RegisterRule("aten::index.Tensor", Index);
  RegisterRules({"aten::index_put", "aten::_index_put_impl"}, IndexPut);
}

}  // namespace spmd::partition
