#include "partition/windowed_einsum.h"

#include <algorithm>

#include "ir/internal_ops.h"
#include "partition/ring.h"

namespace spmd::partition {

namespace {

using ir::Arg;

// A contraction the partitioner lowers as one op of the node's own op on its two matrices.
bool Windowable(const ir::Node& n, const ShardingRule& rule) {
  if (!rule.cost.flops_per_point || *rule.cost.flops_per_point <= 0 || rule.lowering.lower || rule.lowering.local_args ||
      rule.results.size() != 1 || n.num_outputs() != 1 || n.inputs().size() != 2 ||
      rule.operands.size() != 2)
    return false;
  for (const TensorFactors& operand : rule.operands) {  // each holds a contracted factor
    bool contracts = false;
    for (const DimFactors& dim : operand)
      for (int f : dim) contracts |= DimOfFactor(rule.results[0], f) == -1;
    if (!contracts) return false;
  }
  return true;
}

bool StartsWith(const AxisList& a, const AxisList& prefix) {
  return a.size() >= prefix.size() && std::equal(prefix.begin(), prefix.end(), a.begin());
}

Arg AxesArg(const AxisList& axes) {
  return Arg::IntList(std::vector<int64_t>(axes.begin(), axes.end()));
}

TensorType WithExtent(TensorType t, int dim, int64_t extent) {
  t.shape[dim] = extent;
  return t;
}

class Loop {
 public:
  Loop(LocalBuilder& b, const WindowedEinsum& w)
      : b_(b), w_(w), n_(AxesSize(b.mesh(), w.axes)), ops_(ir::InternalOps::Get()) {}

  // Both directions at once: the chunks of the members after this one come from the next
  // member (`from_next`, offsets 1 .. n/2), those before it from the previous one (offsets
  // -1 .. -(n-1)/2), each stream one direction's links. Each product is a step of its own
  // whose first node reads its chunk (the permute passing the chunk on, or the product).
  std::vector<LocalValue> Gather(const std::vector<LocalValue>& operands,
                                 const Sharding& result_layout) {
    const TensorType& global = b_.node().output(0);
    const TensorType out{global.dtype, LocalShape(global.shape, result_layout)};
    const LocalValue& a = operands[w_.operand];
    const LocalValue& other = operands[w_.other];
    const int64_t ahead = n_ / 2, behind = (n_ - 1) / 2;
    // The products in issue order: own, +1, -1, +2, -2, ...
    std::vector<int64_t> order = {0};
    for (int64_t t = 1; t <= ahead; ++t) {
      order.push_back(t);
      if (t <= behind) order.push_back(-t);
    }
    const bool contracted = w_.other_dim >= 0;
    const TensorType part_type =
        contracted ? out : WithExtent(out, w_.result_dim, out.shape[w_.result_dim] / n_);
    // The rows of `other` that chunk `offset` multiplies (contracted factor only).
    auto rows = [&](int64_t offset) {
      return RingSlice(other, w_.other_dim, ((offset % n_) + n_) % n_, 1, 0);
    };
    ir::Value next_rows = contracted ? rows(0) : ir::Value{};
    LocalValue from_next = a, from_prev = a;  // the latest chunk of each stream
    ir::Value acc;
    std::vector<ir::Value> parts(n_);  // by offset from this member, mod n
    for (size_t p = 0; p < order.size(); ++p) {
      const int64_t offset = order[p];
      b_.BeginCostStep(1.0 / static_cast<double>(n_), w_.gemm_extent);
      const LocalValue current = offset == 0 ? a : offset > 0 ? from_next : from_prev;
      // Pass the chunk on before multiplying it, so the transfer runs beside the product.
      if (offset == 0) {
        if (ahead >= 1) from_next = Permute(a, /*to_next=*/false);
        if (behind >= 1) from_prev = Permute(a, /*to_next=*/true);
      } else if (offset > 0 && offset < ahead) {
        from_next = Permute(current, false);
      } else if (offset < 0 && -offset < behind) {
        from_prev = Permute(current, true);
      }
      const ir::Value part =
          Multiply(current.value, contracted ? next_rows : other.value, part_type, result_layout);
      if (p + 1 < order.size() && contracted) next_rows = rows(order[p + 1]);
      if (contracted) acc = p == 0 ? part : Add(acc, part, result_layout, global);
      else parts[((offset % n_) + n_) % n_] = part;
    }
    if (contracted) return {LocalValue{acc, result_layout, global}};
    // The result's chunks side by side in ring order (own first), then in order.
    const int64_t extent = out.shape[w_.result_dim];
    std::vector<int64_t> list(parts.size());
    for (size_t t = 0; t < parts.size(); ++t) list[t] = static_cast<int64_t>(t);
    const LocalValue joined = b_.EmitOp(
        "aten::cat", {{"tensors", ir::ArgType::kTensorList}, {"dim", ir::ArgType::kInt}},
        parts, {Arg::TensorList(list), Arg::Int(w_.result_dim)}, out, result_layout, global);
    const ir::Value ordered = b_.program().EmitInternal(
        ops_.ring_unroll, joined.value,
        {Arg::Int(w_.result_dim), AxesArg(w_.axes), Arg::Int(extent)}, out, result_layout,
        nullptr, w_.axes);
    return {LocalValue{ordered, result_layout, global}};
  }

  // Both directions at once where the chunk splits in two: the first half of each chunk is
  // summed around the ring one way (member m receives from m - 1: chunk (m + n - 1 - t) mod n
  // at step t), the second half the other way (from m + 1: chunk (m + 1 + t) mod n); after n
  // steps each member holds both halves of its own chunk.
  std::vector<LocalValue> Scatter(const std::vector<LocalValue>& operands,
                                  const Sharding& result_layout) {
    const TensorType& global = b_.node().output(0);
    AxisList tiled = result_layout.axes(w_.result_dim);
    tiled.insert(tiled.end(), w_.axes.begin(), w_.axes.end());
    const Sharding layout = result_layout.WithoutPartial().WithDimAxes(w_.result_dim, tiled);
    const TensorType chunk{global.dtype, LocalShape(global.shape, layout)};
    const LocalValue& x = operands[w_.operand];
    const LocalValue& y = operands[w_.other];
    const int64_t halves = n_ > 2 && chunk.shape[w_.result_dim] % 2 == 0 ? 2 : 1;
    const TensorType half = WithExtent(chunk, w_.result_dim, chunk.shape[w_.result_dim] / halves);
    std::vector<ir::Value> acc(halves);
    std::vector<LocalValue> received(halves);
    const double share = 1.0 / static_cast<double>(n_ * halves);
    for (int64_t t = 0; t < n_; ++t) {
      for (int64_t h = 0; h < halves; ++h) {
        const int64_t shift = h == 0 ? n_ - 1 - t : (1 + t) % n_;
        b_.BeginCostStep(share, w_.gemm_extent);
        const ir::Value part = Multiply(RingSlice(x, w_.operand_dim, shift, halves, h), y.value,
                                        half, layout);
        if (t == 0) {
          acc[h] = part;
        } else {
          b_.BeginCostStep(0.0, w_.gemm_extent);  // the add waits for the permute
          acc[h] = Add(received[h].value, part, layout, global);
        }
        if (t + 1 < n_) received[h] = Permute(LocalValue{acc[h], layout, global}, h == 0);
      }
    }
    if (halves == 1) return {LocalValue{acc[0], layout, global}};
    const LocalValue joined = b_.EmitOp(
        "aten::cat", {{"tensors", ir::ArgType::kTensorList}, {"dim", ir::ArgType::kInt}},
        acc, {Arg::TensorList({0, 1}), Arg::Int(w_.result_dim)}, chunk, layout, global);
    return {joined};
  }

 private:
  LocalValue Permute(const LocalValue& v, bool to_next) {
    return RingPermute(b_, v, w_.axes, to_next);
  }

  // Piece `part` of `parts` of tile (member + shift) mod n of dim `dim` of `v`.
  ir::Value RingSlice(const LocalValue& v, int dim, int64_t shift, int64_t parts, int64_t part) {
    const int64_t extent = v.local_shape()[dim];
    return b_.program().EmitInternal(
        ops_.ring_slice, v.value,
        {Arg::Int(dim), AxesArg(w_.axes), Arg::Int(extent), Arg::Int(shift), Arg::Int(parts),
         Arg::Int(part)},
        WithExtent(v.value.type(), dim, extent / (n_ * parts)), v.layout, nullptr, w_.axes);
  }

  // The node's op on `x` (for the windowed operand) and `y` (the other).
  ir::Value Multiply(const ir::Value& x, const ir::Value& y, const TensorType& out,
                     const Sharding& layout) {
    std::vector<ir::Value> inputs(2);
    inputs[w_.operand] = x;
    inputs[w_.other] = y;
    ir::NodePtr m = b_.program().Emit(b_.node().op(), std::move(inputs),
                                      b_.WithSlots(b_.node().args()), {out}, {layout});
    return ir::Value{m, 0};
  }

  ir::Value Add(const ir::Value& a, const ir::Value& c, const Sharding& layout,
                const TensorType& global) {
    return b_.EmitOp("aten::add.Tensor",
                     {{"self", ir::ArgType::kTensor}, {"other", ir::ArgType::kTensor},
                      {"alpha", ir::ArgType::kScalar}},
                     {a, c}, {Arg::Tensor(0), Arg::Tensor(1), Arg::ScalarInt(1)}, a.type(),
                     layout, global)
        .value;
  }

  LocalBuilder& b_;
  const WindowedEinsum& w_;
  const int64_t n_;
  const ir::InternalOps& ops_;
};

}  // namespace

std::optional<WindowedEinsum> PlanWindowedGather(const ir::Node& n, const ShardingRule& rule,
                                                 const Mesh& mesh, int i, const Sharding& have,
                                                 const Sharding& want,
                                                 const WindowedEinsumOptions& options) {
  const int64_t threshold = options.threshold_bytes;
  if (threshold < 0 || options.weight_operand || !Windowable(n, rule) || !have.valid() ||
      !want.valid() ||
      have.IsPartial() || have.is_manual() || have.rank() != want.rank())
    return std::nullopt;
  WindowedEinsum w;
  w.operand = i;
  w.other = 1 - i;
  for (int64_t d = 0; d < have.rank(); ++d) {
    if (have.axes(d) == want.axes(d)) continue;
    if (w.operand_dim >= 0 || !StartsWith(have.axes(d), want.axes(d))) return std::nullopt;
    w.operand_dim = static_cast<int>(d);
    w.axes.assign(have.axes(d).begin() + want.axes(d).size(), have.axes(d).end());
  }
  if (w.operand_dim < 0 || rule.operands[i][w.operand_dim].size() != 1) return std::nullopt;
  const int f = rule.operands[i][w.operand_dim][0];
  const int in_result = DimOfFactor(rule.results[0], f);
  const int in_other = DimOfFactor(rule.operands[w.other], f);
  if (in_result == -1) {  // contracted: the other operand's rows of each chunk
    if (in_other < 0) return std::nullopt;
    w.other_dim = in_other;
    w.gemm_extent = 'k';
  } else {  // a result dim of this operand alone (not a batch dim)
    if (in_result < 0 || in_other != -1) return std::nullopt;
    w.result_dim = in_result;
    w.gemm_extent = i == 0 ? 'm' : 'n';
  }
  const int64_t members = AxesSize(mesh, w.axes);
  const int64_t tiles = AxesSize(mesh, want.axes(w.operand_dim)) * members;
  if (members < 2 || rule.factors[f].size % tiles != 0) return std::nullopt;
  const TensorType local{n.input(i).type().dtype, LocalShape(n.input(i).type().shape, have)};
  if (local.bytes() * members < threshold) return std::nullopt;
  if (rule.factors[f].size / tiles < options.min_step_extent) return std::nullopt;
  return w;
}

std::optional<WindowedEinsum> PlanWindowedScatter(const ir::Node& n, const ShardingRule& rule,
                                                  const Mesh& mesh, const Sharding& partial,
                                                  const Sharding& wanted,
                                                  const WindowedEinsumOptions& options) {
  const int64_t threshold = options.threshold_bytes;
  if (threshold < 0 || !Windowable(n, rule) || !partial.IsPartial() ||
      partial.partial_op() != ReduceOp::kSum || partial.is_manual() || !wanted.valid() ||
      wanted.IsPartial() || wanted.is_manual() || wanted.mesh() != partial.mesh() ||
      wanted.rank() != partial.rank())
    return std::nullopt;
  WindowedEinsum w;
  w.kind = WindowedEinsum::Kind::kScatterResult;
  for (int64_t d = 0; d < wanted.rank(); ++d) {
    if (wanted.axes(d) == partial.axes(d)) continue;
    if (w.result_dim >= 0 || !StartsWith(wanted.axes(d), partial.axes(d))) return std::nullopt;
    w.result_dim = static_cast<int>(d);
    w.axes.assign(wanted.axes(d).begin() + partial.axes(d).size(), wanted.axes(d).end());
  }
  if (w.result_dim < 0) return std::nullopt;
  AxisList pending = partial.partial_axes(), scattered = w.axes;
  std::sort(pending.begin(), pending.end());
  std::sort(scattered.begin(), scattered.end());
  if (pending != scattered || rule.results[0][w.result_dim].size() != 1) return std::nullopt;
  const int f = rule.results[0][w.result_dim][0];
  const int in0 = DimOfFactor(rule.operands[0], f), in1 = DimOfFactor(rule.operands[1], f);
  if ((in0 == -1) == (in1 == -1)) return std::nullopt;  // in exactly one matrix
  w.operand = in0 != -1 ? 0 : 1;
  w.other = 1 - w.operand;
  w.operand_dim = w.operand == 0 ? in0 : in1;
  if (w.operand_dim < 0) return std::nullopt;
  w.gemm_extent = w.operand == 0 ? 'm' : 'n';
  const int64_t members = AxesSize(mesh, w.axes);
  const int64_t tiles = AxesSize(mesh, partial.axes(w.result_dim)) * members;
  if (members < 2 || rule.factors[f].size % tiles != 0) return std::nullopt;
  const TensorType local{n.output(0).dtype, LocalShape(n.output(0).shape, partial)};
  if (local.bytes() < threshold) return std::nullopt;
  if (rule.factors[f].size / tiles < options.min_step_extent) return std::nullopt;
  return w;
}

std::vector<LocalValue> LowerWindowedEinsum(LocalBuilder& b, const WindowedEinsum& w,
                                            const std::vector<LocalValue>& operands,
                                            const Sharding& result_layout) {
  Loop loop(b, w);
  return w.kind == WindowedEinsum::Kind::kGatherOperand ? loop.Gather(operands, result_layout)
                                                        : loop.Scatter(operands, result_layout);
}

}  // namespace spmd::partition
