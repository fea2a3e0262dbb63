// The local ops fused attention's lowerings emit: the kernel with its mask replaced, global
// positions of a tile, and a causal mask made of them (rules/attention.h).
#include <limits>

#include "ir/internal_ops.h"
#include "partition/rules/attention.h"
#include "partition/rules/local_ops.h"
#include "partition/rules/rule.h"

namespace spmd::partition {

using ir::Arg;
using ir::ArgType;

std::vector<LocalValue> EmitAttention(LocalBuilder& b, const AttentionNode& a,
                                      std::vector<ir::Value> inputs, bool is_causal,
                                      const LocalValue* mask, const std::vector<TensorType>& outs,
                                      const std::vector<Sharding>& layouts,
                                      const std::vector<TensorType>& globals) {
  const ir::Node& node = b.node();
  std::vector<Arg> args = b.WithSlots(node.args());
  args.at(ArgIndex(node, "is_causal")) = Arg::Bool(is_causal);
  const int mask_arg = ArgIndex(node, "attn_mask");
  if (mask) {
    if (a.mask >= 0) {
      inputs[a.mask] = mask->value;
    } else {
      inputs.push_back(mask->value);
      args.at(mask_arg) = Arg::Tensor(static_cast<int64_t>(inputs.size()) - 1);
    }
  }
  ir::NodePtr n = b.program().Emit(node.op(), std::move(inputs), std::move(args), outs, layouts);
  std::vector<LocalValue> results;
  for (size_t o = 0; o < outs.size(); ++o)
    results.push_back(LocalValue{ir::Value{n, static_cast<int>(o)}, layouts[o], globals[o]});
  return results;
}

LocalValue Range(LocalBuilder& b, int64_t start, int64_t end, int64_t step) {
  static const std::vector<ir::ArgSchema> schema = {
      {"start", ArgType::kScalar},         {"end", ArgType::kScalar},
      {"step", ArgType::kScalar},          {"dtype", ArgType::kScalarType, true},
      {"layout", ArgType::kLayout, true},  {"device", ArgType::kDevice, true},
      {"pin_memory", ArgType::kBool, true}};
  const TensorType t{DType::kInt64, {(end - start) / step}};
  return b.EmitOp("aten::arange.start_step", schema, {},
                  {Arg::ScalarInt(start), Arg::ScalarInt(end), Arg::ScalarInt(step), Arg::None(),
                   Arg::None(), Arg::None(), Arg::None()},
                  t, Sharding::Replicated(b.program().mesh(), 1), t);
}

LocalValue TileTable(LocalBuilder& b, const AxisList& axes, int64_t first, int64_t step,
                     int64_t shift) {
  const MeshPtr& mesh = b.program().mesh();
  const int64_t k = AxesSize(*mesh, axes);
  const LocalValue table = Range(b, first, first + k * step, step);
  if (k == 1) return table;
  const Sharding sliced = Sharding::Tiled(mesh, {axes});
  const ir::Value entry = b.program().EmitInternal(
      ir::InternalOps::Get().ring_slice, table.value,
      {Arg::Int(0), Arg::IntList(std::vector<int64_t>(axes.begin(), axes.end())), Arg::Int(k),
       Arg::Int(((shift % k) + k) % k), Arg::Int(1), Arg::Int(0)},
      TensorType{DType::kInt64, {1}}, sliced, nullptr, axes);
  return LocalValue{entry, sliced, table.global};
}

LocalValue TilePositions(LocalBuilder& b, const AxisList& axes, int64_t tile, int64_t shift,
                         bool column) {
  LocalValue positions = Range(b, 0, tile, 1);
  if (AxesSize(b.mesh(), axes) > 1)
    positions = Binary(b, "aten::add.Tensor", positions, TileTable(b, axes, 0, tile, shift));
  return column ? Unsqueezed(b, positions) : positions;
}

LocalValue Unsqueezed(LocalBuilder& b, const LocalValue& x) {
  static const std::vector<ir::ArgSchema> unsqueeze = {{"self", ArgType::kTensor},
                                                       {"dim", ArgType::kInt}};
  auto with_one = [](TensorType t) {
    t.shape.push_back(1);
    return t;
  };
  std::vector<AxisList> dims = x.layout.dim_axes();
  dims.push_back({});
  return b.EmitOp("aten::unsqueeze_copy", unsqueeze, {x.value}, {Arg::Tensor(0), Arg::Int(-1)},
                  with_one(x.value.type()), Sharding::Tiled(b.program().mesh(), std::move(dims)),
                  with_one(x.global));
}

LocalValue AtLeast(LocalBuilder& b, const LocalValue& x, const LocalValue& y) {
  static const std::vector<ir::ArgSchema> two = {{"self", ArgType::kTensor},
                                                 {"other", ArgType::kTensor}};
  Shape shape = x.local_shape();
  const Shape& other = y.local_shape();
  if (other.size() > shape.size()) shape.insert(shape.begin(), other.size() - shape.size(), 1);
  for (size_t d = 0; d < other.size(); ++d) {  // broadcast from the right
    int64_t& s = shape[shape.size() - other.size() + d];
    if (s == 1) s = other[d];
  }
  const TensorType t{DType::kBool, shape};
  return b.EmitOp("aten::ge.Tensor", two, {x.value, y.value}, {Arg::Tensor(0), Arg::Tensor(1)},
                  t, Sharding::Replicated(b.program().mesh(), static_cast<int64_t>(shape.size())), t);
}

LocalValue CausalMask(LocalBuilder& b, const LocalValue& q_rows, const LocalValue& k_cols,
                      DType dtype) {
  static const std::vector<ir::ArgSchema> where = {
      {"condition", ArgType::kTensor}, {"self", ArgType::kScalar}, {"other", ArgType::kScalar}};
  const LocalValue kept = AtLeast(b, q_rows, k_cols);
  const TensorType additive{DType::kFloat32, kept.local_shape()};
  const LocalValue fp32 = b.EmitOp("aten::where.Scalar", where, {kept.value},
                                   {Arg::Tensor(0), Arg::ScalarDouble(0.0),
                                    Arg::ScalarDouble(-std::numeric_limits<double>::infinity())},
                                   additive, kept.layout, additive);
  const LocalValue mask = dtype == DType::kFloat32 ? fp32 : CastTo(b, fp32, dtype);
  // A real pod's flash kernel masks its tiles by their offsets: the mask is never held.
  for (const LocalValue* v : {&kept, &fp32, &mask}) b.program().MarkMadeByReader(v->value.node.get());
  return mask;
}

}  // namespace spmd::partition
