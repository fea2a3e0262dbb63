#include "partition/rules/local_ops.h"

#include "ir/internal_ops.h"

namespace spmd::partition {

using ir::Arg;
using ir::ArgType;

namespace {

TensorType WithDType(const TensorType& t, DType out) {
  return out == DType::kUndefined ? t : TensorType{out, t.shape};
}

}  // namespace

LocalValue Binary(LocalBuilder& b, const char* op, const LocalValue& x, const LocalValue& y,
                  int64_t alpha, DType out) {
  static const std::vector<ir::ArgSchema> schema = {
      {"self", ArgType::kTensor}, {"other", ArgType::kTensor}, {"alpha", ArgType::kScalar}};
  return b.EmitOp(op, schema, {x.value, y.value},
                  {Arg::Tensor(0), Arg::Tensor(1), Arg::ScalarInt(alpha)},
                  WithDType(x.value.type(), out), x.layout, WithDType(x.global, out));
}

LocalValue Multiply(LocalBuilder& b, const LocalValue& x, const LocalValue& y) {
  static const std::vector<ir::ArgSchema> schema = {{"self", ArgType::kTensor},
                                                    {"other", ArgType::kTensor}};
  return b.EmitOp("aten::mul.Tensor", schema, {x.value, y.value}, {Arg::Tensor(0), Arg::Tensor(1)},
                  x.value.type(), x.layout, x.global);
}

LocalValue Unary(LocalBuilder& b, const char* op, const LocalValue& x) {
  static const std::vector<ir::ArgSchema> schema = {{"self", ArgType::kTensor}};
  return b.EmitOp(op, schema, {x.value}, {Arg::Tensor(0)}, x.value.type(), x.layout, x.global);
}

LocalValue WithScalar(LocalBuilder& b, const char* op, const LocalValue& x, int64_t v, DType out) {
  static const std::vector<ir::ArgSchema> schema = {{"self", ArgType::kTensor},
                                                    {"other", ArgType::kScalar}};
  return b.EmitOp(op, schema, {x.value}, {Arg::Tensor(0), Arg::ScalarInt(v)},
                  WithDType(x.value.type(), out), x.layout, WithDType(x.global, out));
}

LocalValue RowOffset(LocalBuilder& b, const AxisList& axes, int64_t tile, int64_t left) {
  return TileTable(b, axes, -left, tile, 0);
}

LocalValue LogicalAnd(LocalBuilder& b, const LocalValue& x, const LocalValue& y) {
  static const std::vector<ir::ArgSchema> schema = {{"self", ArgType::kTensor},
                                                    {"other", ArgType::kTensor}};
  return b.EmitOp("aten::logical_and", schema, {x.value, y.value},
                  {Arg::Tensor(0), Arg::Tensor(1)}, x.value.type(), x.layout, x.global);
}

LocalValue Clamp(LocalBuilder& b, const LocalValue& x, int64_t lo, int64_t hi) {
  static const std::vector<ir::ArgSchema> schema = {
      {"self", ArgType::kTensor}, {"min", ArgType::kScalar, true}, {"max", ArgType::kScalar, true}};
  return b.EmitOp("aten::clamp", schema, {x.value},
                  {Arg::Tensor(0), Arg::ScalarInt(lo), Arg::ScalarInt(hi)}, x.value.type(),
                  x.layout, x.global);
}

LocalValue Where(LocalBuilder& b, const LocalValue& keep, const LocalValue& x, const LocalValue& y) {
  static const std::vector<ir::ArgSchema> schema = {
      {"condition", ArgType::kTensor}, {"self", ArgType::kTensor}, {"other", ArgType::kTensor}};
  return b.EmitOp("aten::where.self", schema, {keep.value, x.value, y.value},
                  {Arg::Tensor(0), Arg::Tensor(1), Arg::Tensor(2)}, x.value.type(), x.layout,
                  x.global);
}

LocalValue CastTo(LocalBuilder& b, const LocalValue& x, DType dtype) {
  static const std::vector<ir::ArgSchema> schema = {
      {"self", ArgType::kTensor},          {"dtype", ArgType::kScalarType, true},
      {"layout", ArgType::kLayout, true},  {"device", ArgType::kDevice, true},
      {"pin_memory", ArgType::kBool, true}, {"non_blocking", ArgType::kBool},
      {"memory_format", ArgType::kMemoryFormat, true}};
  return b.EmitOp("aten::_to_copy", schema, {x.value},
                  {Arg::Tensor(0), Arg::ScalarType(static_cast<int64_t>(dtype)), Arg::None(),
                   Arg::None(), Arg::None(), Arg::Bool(false), Arg::None()},
                  WithDType(x.value.type(), dtype), x.layout, WithDType(x.global, dtype));
}

LocalValue WhereElse(LocalBuilder& b, const LocalValue& keep, const LocalValue& x, int64_t other) {
  static const std::vector<ir::ArgSchema> schema = {
      {"condition", ArgType::kTensor}, {"self", ArgType::kTensor}, {"other", ArgType::kScalar}};
  return b.EmitOp("aten::where.ScalarOther", schema, {keep.value, x.value},
                  {Arg::Tensor(0), Arg::Tensor(1), Arg::ScalarInt(other)}, x.value.type(),
                  x.layout, x.global);
}

LocalIndex IndexIntoTile(LocalBuilder& b, const LocalValue& global_index, const AxisList& axes,
                         int64_t rows, int64_t exclude, bool mask_for_rows) {
  // (The offset is int64, so the local index is too, whatever the indices' integer type.)
  LocalValue offset = RowOffset(b, axes, rows, 0);
  LocalValue local = Binary(b, "aten::sub.Tensor", global_index, offset, 1, DType::kInt64);
  LocalValue keep = LogicalAnd(b, WithScalar(b, "aten::ge.Scalar", local, 0, DType::kBool),
                               WithScalar(b, "aten::lt.Scalar", local, rows, DType::kBool));
  if (exclude >= 0)
    keep = LogicalAnd(b, keep,
                      WithScalar(b, "aten::ne.Scalar", global_index, exclude, DType::kBool));
  LocalValue index = Clamp(b, local, 0, rows - 1);
  if (mask_for_rows) keep = Unsqueezed(b, keep);
  return {index, keep};
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
  const Arg axes_arg = Arg::IntList(std::vector<int64_t>(axes.begin(), axes.end()));
  shift = ((shift % k) + k) % k;
  const ir::InternalOps& ops = ir::InternalOps::Get();
  const ir::Value entry =
      shift == 0  // this member's own entry
          ? b.program().EmitInternal(ops.shard_slice, table.value,
                                     {Arg::Int(0), axes_arg, Arg::Int(k)},
                                     TensorType{DType::kInt64, {1}}, sliced, nullptr, axes)
          : b.program().EmitInternal(ops.ring_slice, table.value,
                                     {Arg::Int(0), axes_arg, Arg::Int(k), Arg::Int(shift),
                                      Arg::Int(1), Arg::Int(0)},
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

}  // namespace spmd::partition
