// Grouped GEMM (torch._grouped_mm: the experts of a mixture of experts, torchtitan's and Hugging
// Face's grouped_mm path), the rows of its tokens sorted by expert, group e the rows
// [offs[e - 1], offs[e]) (offs[-1] = 0; rows from offs[E - 1] on are left alone):
//
//   experts:      x [T, K], w [E, K, N], offs [E] -> out [T, N]     out[t] = x[t] @ w[e(t)]
//   weight grad:  x [K, T], g [T, N],    offs [E] -> out [E, K, N]  out[e] = x[:, rows e] @ g[rows e]
//
// In factors: t the rows, k and n the matrices', e the experts. The experts' form is a sum over
// e of each expert's rows: e is a summed reduction there (a device holding experts [e0, e1)
// computes their rows, zeros elsewhere: a partial sum over e's axes), and t passes through;
// in the weight grad t is the contraction (summed) and e passes through to the result. Sharded
// over e, the tokens are gathered and the outputs reduce-scattered back (Megatron's all-gather
// token dispatcher: dropless, every token computed by its own expert), with the devices' work
// split as the experts are: plan mode prices the balanced share (FLOPs per point 2 / E over
// t k n e), whatever the routing. The lowering rebases offs onto the device's rows and experts
// and zeroes the rows of other groups, which the kernel would give to its first and last ones.
// offs is read whole (one int per expert). A bias, other forms (3-D by 3-D, 3-D by 2-D): no
// rule.
#include <algorithm>

#include "partition/halo.h"
#include "partition/rules/all_rules.h"
#include "partition/rules/local_ops.h"
#include "partition/rules/rule.h"

namespace spmd::partition {

namespace {

using ir::Arg;
using ir::ArgType;

struct GroupedForm {
  int rows = -1;  // the operand holding the rows (t), as its dim 0
  bool experts_in_result = false;  // the weight grad's [E, K, N]
  int t = -1, e = -1;  // factors
};

// The rows each local group of the kernel starts and ends at, and which rows are this device's
// experts': offs rebased onto the device's tile of rows and of experts.
struct LocalGroups {
  LocalValue offs;  // int32 [experts per device], into the local rows
  LocalValue keep;  // bool [local rows, 1]: the row belongs to one of the local experts
};

LocalValue Gathered(LocalBuilder& b, const LocalValue& table, const LocalValue& index) {
  static const std::vector<ir::ArgSchema> schema = {
      {"self", ArgType::kTensor}, {"dim", ArgType::kInt}, {"index", ArgType::kTensor}};
  const TensorType out{table.value.type().dtype, index.local_shape()};
  return b.EmitOp("aten::index_select", schema, {table.value, index.value},
                  {Arg::Tensor(0), Arg::Int(0), Arg::Tensor(1)}, out, index.layout, out);
}

LocalGroups Groups(LocalBuilder& b, const LocalValue& offs, const AxisList& row_axes,
                   int64_t rows, const AxisList& expert_axes, int64_t experts, int64_t E) {
  // bounds[j] = offs[j - 1] (0 for j = 0), j <= E: where group j starts, E: where all end.
  const LocalValue bounds = Concat(b, {Range(b, 0, 1, 1), CastTo(b, offs, DType::kInt64)}, 0);
  const LocalValue first_expert = TileTable(b, expert_axes, 0, experts, 0);  // [1]
  const LocalValue first_row = TileTable(b, row_axes, 0, rows, 0);           // [1]
  // Local group j ends where expert e0 + j does (experts past E end at the last row).
  const LocalValue ends = Gathered(
      b, bounds,
      Clamp(b, Binary(b, "aten::add.Tensor", Range(b, 1, experts + 1, 1), first_expert), 0, E));
  const LocalValue local_ends =
      Clamp(b, Binary(b, "aten::sub.Tensor", ends, first_row), 0, rows);
  const LocalValue start = Gathered(b, bounds, Clamp(b, first_expert, 0, E));  // [1]
  const LocalValue stop =  // where expert e0 + experts starts
      Gathered(b, bounds, Clamp(b, TileTable(b, expert_axes, experts, experts, 0), 0, E));
  const LocalValue positions = TilePositions(b, row_axes, rows, 0, /*column=*/true);
  static const std::vector<ir::ArgSchema> one = {{"self", ArgType::kTensor}};
  const LocalValue past_stop = AtLeast(b, positions, stop);
  const LocalValue before_stop =
      b.EmitOp("aten::logical_not", one, {past_stop.value}, {Arg::Tensor(0)},
               past_stop.value.type(), past_stop.layout, past_stop.global);
  const LocalValue keep = LogicalAnd(b, AtLeast(b, positions, start), before_stop);
  return {CastTo(b, local_ends, DType::kInt32), keep};
}

// The kernels (CPU's and CUDA's) take matrices whose rows start 16 bytes apart; a sharded dim
// may leave a local extent that does not (a tile of 2 floats). The local op then runs on its
// operands padded with zeros along the matrices' last dims (zero columns of a contraction add
// nothing; zero result columns are sliced off).
int64_t AlignedExtent(int64_t n, DType dtype) {
  const int64_t a = std::max<int64_t>(1, 16 / std::max<int64_t>(1, ElementSize(dtype)));
  return (n + a - 1) / a * a;
}

// The node's op on `operands` (rows, matrix, offs), each matrix's last dims padded to the
// kernel's alignment; the result sliced back to the layout's local shape.
LocalValue AlignedGroupedMm(LocalBuilder& b, const GroupedForm& form,
                            std::vector<LocalValue> operands) {
  const TensorType& global = b.node().output(0);
  const Sharding& layout = b.result_layout(0);
  const Shape local = LocalShape(global.shape, layout);
  LocalValue& a = operands[0];
  LocalValue& m = operands[1];
  const DType dt = a.value.type().dtype;
  const int64_t inner = a.local_shape()[1];  // K (experts) or T (weight grad)
  const int64_t pad_inner = AlignedExtent(inner, dt) - inner;
  const int n_dim = m.value.type().rank() - 1;
  const int64_t n = m.local_shape()[n_dim];
  const int64_t pad_n = AlignedExtent(n, dt) - n;
  if (pad_inner == 0 && pad_n == 0) return b.EmitNodeOp(operands)[0];
  a = PadRows(b, a, 1, 0, pad_inner);
  m = PadRows(b, m, form.experts_in_result ? 0 : 1, 0, pad_inner);  // its K (or T) dim
  m = PadRows(b, m, n_dim, 0, pad_n);
  Shape padded = local;
  padded.back() += pad_n;
  std::vector<ir::Value> inputs;
  for (const LocalValue& v : operands) inputs.push_back(v.value);
  ir::NodePtr op = b.program().Emit(b.node().op(), std::move(inputs), b.WithSlots(b.node().args()),
                                    {TensorType{global.dtype, padded}}, {layout});
  return SliceRows(b, LocalValue{ir::Value{op, 0}, layout, global},
                   static_cast<int64_t>(local.size()) - 1, 0, local.back());
}

std::optional<ShardingRule> GroupedMm(const ir::Node& node) {
  const int oi = InputOfArg(node, "offs"), bi = InputOfArg(node, "bias");
  if (node.inputs().size() < 3 || oi != 2 || bi >= 0) return std::nullopt;
  const TensorType &a = node.input(0).type(), &m = node.input(1).type();
  const TensorType& offs = node.input(2).type();
  if (a.rank() != 2 || offs.rank() != 1) return std::nullopt;
  const int64_t E = offs.shape[0];
  ShardingRule rule;
  rule.executor.reads_strides = true;  // the kernel takes row- or column-major matrices only
  GroupedForm form;
  if (m.rank() == 3) {  // experts: [T, K] x [E, K, N] -> [T, N]
    if (m.shape[0] != E || m.shape[1] != a.shape[1]) return std::nullopt;
    const int t = rule.AddFactor(a.shape[0]);
    const int k = rule.AddFactor(a.shape[1], FactorKind::kReduction);
    const int n = rule.AddFactor(m.shape[2]);
    const int e = rule.AddFactor(E, FactorKind::kReduction);
    rule.factors[k].sums = rule.factors[e].sums = true;
    rule.operands = {{{t}, {k}}, {{e}, {k}, {n}}, {{}}};
    rule.results = {{{t}, {n}}};
    form = GroupedForm{0, false, t, e};
  } else if (m.rank() == 2) {  // weight grad: [K, T] x [T, N] -> [E, K, N]
    if (m.shape[0] != a.shape[1]) return std::nullopt;
    const int k = rule.AddFactor(a.shape[0]);
    const int t = rule.AddFactor(a.shape[1], FactorKind::kReduction);
    const int n = rule.AddFactor(m.shape[1]);
    const int e = rule.AddFactor(E);
    rule.factors[t].sums = true;
    rule.operands = {{{k}, {t}}, {{t}, {n}}, {{}}};
    rule.results = {{{e}, {k}, {n}}};
    form = GroupedForm{1, true, t, e};
  } else {
    return std::nullopt;
  }
  rule.cost.flops_per_point = 2.0 / static_cast<double>(E);  // each row meets one expert
  rule.lowering.lower = [form, E](LocalBuilder& b, const std::vector<LocalValue>& operands) {
    const AxisList &row_axes = b.factor_axes()[form.t], &expert_axes = b.factor_axes()[form.e];
    if (row_axes.empty() && expert_axes.empty())
      return std::vector<LocalValue>{AlignedGroupedMm(b, form, operands)};
    const LocalValue& rows_of = operands[form.rows];
    const int64_t rows = rows_of.local_shape()[0];
    const int64_t experts = (E + AxesSize(b.mesh(), expert_axes) - 1) / AxesSize(b.mesh(), expert_axes);
    const LocalGroups g = Groups(b, operands[2], row_axes, rows, expert_axes, experts, E);
    std::vector<LocalValue> local = operands;
    local[2] = g.offs;
    // The rows of other experts' groups read zeros (for the weight grad, g's rows: the
    // contraction's other operand may stay as it is).
    local[form.rows] = WhereElseZero(b, g.keep, local[form.rows]);
    LocalValue out = AlignedGroupedMm(b, form, local);
    if (!form.experts_in_result) out = WhereElseZero(b, g.keep, out);  // rows past the groups
    return std::vector<LocalValue>{out};
  };
  return rule;
}

}  // namespace

void RegisterGroupedMmRules() { RegisterRule("aten::_grouped_mm", GroupedMm); }

}  // namespace spmd::partition
