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
  const int64_t k = AxesSize(b.mesh(), axes);
  static const std::vector<ir::ArgSchema> schema = {
      {"start", ArgType::kScalar},         {"end", ArgType::kScalar},
      {"step", ArgType::kScalar},          {"dtype", ArgType::kScalarType, true},
      {"layout", ArgType::kLayout, true},  {"device", ArgType::kDevice, true},
      {"pin_memory", ArgType::kBool, true}};
  TensorType all{DType::kInt64, {k}};
  const MeshPtr& mesh = b.program().mesh();
  LocalValue offsets = b.EmitOp("aten::arange.start_step", schema, {},
                                {Arg::ScalarInt(-left), Arg::ScalarInt(k * tile - left),
                                 Arg::ScalarInt(tile), Arg::None(), Arg::None(), Arg::None(),
                                 Arg::None()},
                                all, Sharding::Replicated(mesh, 1), all);
  Sharding sliced = Sharding::Tiled(mesh, {axes});
  ir::Value v = b.program().EmitInternal(
      ir::InternalOps::Get().shard_slice, offsets.value,
      {Arg::Int(0), Arg::IntList(std::vector<int64_t>(axes.begin(), axes.end())), Arg::Int(k)},
      TensorType{DType::kInt64, {1}}, sliced, nullptr, axes);
  return LocalValue{v, sliced, all};
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
  static const std::vector<ir::ArgSchema> and_schema = {{"self", ArgType::kTensor},
                                                        {"other", ArgType::kTensor}};
  auto both = [&](const LocalValue& x, const LocalValue& y) {
    return b.EmitOp("aten::logical_and", and_schema, {x.value, y.value},
                    {Arg::Tensor(0), Arg::Tensor(1)}, x.value.type(), x.layout, x.global);
  };
  LocalValue keep = both(WithScalar(b, "aten::ge.Scalar", local, 0, DType::kBool),
                         WithScalar(b, "aten::lt.Scalar", local, rows, DType::kBool));
  if (exclude >= 0)
    keep = both(keep, WithScalar(b, "aten::ne.Scalar", global_index, exclude, DType::kBool));
  static const std::vector<ir::ArgSchema> clamp_schema = {
      {"self", ArgType::kTensor}, {"min", ArgType::kScalar, true}, {"max", ArgType::kScalar, true}};
  LocalValue index = b.EmitOp("aten::clamp", clamp_schema, {local.value},
                              {Arg::Tensor(0), Arg::ScalarInt(0), Arg::ScalarInt(rows - 1)},
                              local.value.type(), local.layout, local.global);
  if (mask_for_rows) {
    static const std::vector<ir::ArgSchema> unsqueeze_schema = {{"self", ArgType::kTensor},
                                                                {"dim", ArgType::kInt}};
    Shape shape = keep.value.type().shape, global = keep.global.shape;
    shape.push_back(1);
    global.push_back(1);
    std::vector<AxisList> dims = keep.layout.dim_axes();
    dims.push_back({});
    keep = b.EmitOp("aten::unsqueeze_copy", unsqueeze_schema, {keep.value},
                    {Arg::Tensor(0), Arg::Int(-1)}, TensorType{DType::kBool, shape},
                    Sharding::Tiled(b.program().mesh(), dims), TensorType{DType::kBool, global});
  }
  return {index, keep};
}

}  // namespace spmd::partition
