#include "partition/halo.h"

#include "core/error.h"
#include "ir/internal_ops.h"
#include "partition/rules/local_ops.h"

namespace spmd::partition {

namespace {

using ir::Arg;
using ir::ArgType;

Arg AxesArg(const AxisList& axes) {
  return Arg::IntList(std::vector<int64_t>(axes.begin(), axes.end()));
}

// The halo's collective-permutes in the program statistics, as the runtime counts them, each
// carried out by `node` (the shift, or the halo exchange making both of its permutes).
void RecordPermute(ProgramBuilder& b, const AxisList& axes, int64_t bytes, const ir::Node* node) {
  b.RecordCollective("collective-permute", axes, bytes, node);
}

// Rows of x shifted by `shift` members along `axes` (member i receives member i - shift's rows;
// members with no such source get zeros).
LocalValue Shift(LocalBuilder& b, const LocalValue& x, const AxisList& axes, int64_t shift) {
  const int64_t k = AxesSize(b.mesh(), axes);
  std::vector<int64_t> pairs;
  for (int64_t i = 0; i < k; ++i)
    if (i + shift >= 0 && i + shift < k) pairs.insert(pairs.end(), {i, i + shift});
  return PermuteTiles(b, x, axes, std::move(pairs));
}

Shape WithExtent(Shape s, int64_t dim, int64_t extent) {
  s[dim] = extent;
  return s;
}

}  // namespace

LocalValue PermuteTiles(LocalBuilder& b, const LocalValue& x, const AxisList& axes,
                        std::vector<int64_t> pairs) {
  ir::Value r = b.program().EmitInternal(ir::InternalOps::Get().collective_permute, x.value,
                                         {AxesArg(axes), Arg::IntList(std::move(pairs))},
                                         x.value.type(), x.layout, nullptr, axes);
  RecordPermute(b.program(), axes, x.value.type().bytes(), r.node.get());
  return LocalValue{r, x.layout, x.global};
}

LocalValue RotateTiles(LocalBuilder& b, const LocalValue& x, const AxisList& axes, int64_t shift) {
  const int64_t k = AxesSize(b.mesh(), axes);
  shift = ((shift % k) + k) % k;
  if (shift == 0) return x;
  std::vector<int64_t> pairs;
  for (int64_t i = 0; i < k; ++i) pairs.insert(pairs.end(), {i, (i + shift) % k});
  return PermuteTiles(b, x, axes, std::move(pairs));
}

LocalValue SliceRows(LocalBuilder& b, const LocalValue& x, int64_t dim, int64_t start,
                     int64_t length) {
  const TensorType& t = x.value.type();
  if (start == 0 && length == t.shape[dim]) return x;
  static const std::vector<ir::ArgSchema> schema = {{"self", ArgType::kTensor},
                                                    {"dim", ArgType::kInt},
                                                    {"start", ArgType::kInt, true},
                                                    {"end", ArgType::kInt, true},
                                                    {"step", ArgType::kInt}};
  return b.EmitOp(
      "aten::slice_copy.Tensor", schema, {x.value},
      {Arg::Tensor(0), Arg::Int(dim), Arg::Int(start), Arg::Int(start + length), Arg::Int(1)},
      TensorType{t.dtype, WithExtent(t.shape, dim, length)}, x.layout, x.global);
}

LocalValue PadRows(LocalBuilder& b, const LocalValue& x, int64_t dim, int64_t before, int64_t after,
                   double value) {
  const TensorType& t = x.value.type();
  if (before == 0 && after == 0) return x;
  // constant_pad_nd's list runs from the last dim backwards: (last_lo, last_hi, ..., dim_lo,
  // dim_hi).
  std::vector<int64_t> pad(2 * (t.rank() - dim), 0);
  pad[pad.size() - 2] = before;
  pad[pad.size() - 1] = after;
  static const std::vector<ir::ArgSchema> schema = {
      {"self", ArgType::kTensor}, {"pad", ArgType::kIntList}, {"value", ArgType::kScalar}};
  return b.EmitOp("aten::constant_pad_nd", schema, {x.value},
                  {Arg::Tensor(0), Arg::IntList(pad), Arg::ScalarDouble(value)},
                  TensorType{t.dtype, WithExtent(t.shape, dim, t.shape[dim] + before + after)},
                  x.layout, x.global);
}

LocalValue Concat(LocalBuilder& b, const std::vector<LocalValue>& parts, int64_t dim) {
  SPMD_CHECK(!parts.empty(), "internal error: concatenating nothing");
  if (parts.size() == 1) return parts[0];
  static const std::vector<ir::ArgSchema> schema = {{"tensors", ArgType::kTensorList},
                                                    {"dim", ArgType::kInt}};
  std::vector<ir::Value> inputs;
  std::vector<int64_t> indices;
  TensorType out = parts[0].value.type();
  out.shape[dim] = 0;
  for (const LocalValue& p : parts) {
    indices.push_back(static_cast<int64_t>(inputs.size()));
    inputs.push_back(p.value);
    out.shape[dim] += p.value.type().shape[dim];
  }
  return b.EmitOp("aten::cat", schema, std::move(inputs), {Arg::TensorList(indices), Arg::Int(dim)},
                  out, parts[0].layout, parts[0].global);
}

LocalValue HaloExchange(LocalBuilder& b, const LocalValue& v, int64_t dim, int64_t left,
                        int64_t right, double value) {
  if (left == 0 && right == 0) return v;
  const AxisList& axes = v.layout.axes(dim);
  const TensorType& t = v.value.type();
  SPMD_CHECK(!axes.empty() && v.global.shape[dim] % AxesSize(b.mesh(), axes) == 0 &&
                 left <= t.shape[dim] && right <= t.shape[dim],
             "internal error: halo exchange of ", left, " and ", right, " rows on dim ", dim,
             " of a ", t.ToString(), " tile of ", v.global.ToString(), " laid out ",
             v.layout.ToNamedString());
  TensorType out{t.dtype, WithExtent(t.shape, dim, t.shape[dim] + left + right)};
  ir::Value r = b.program().EmitInternal(
      ir::InternalOps::Get().halo_exchange, v.value,
      {Arg::Int(dim), AxesArg(axes), Arg::Int(left), Arg::Int(right), Arg::Double(value)}, out,
      v.layout, nullptr, axes);
  const int64_t row_bytes = t.shape[dim] == 0 ? 0 : t.bytes() / t.shape[dim];
  if (left > 0) RecordPermute(b.program(), axes, left * row_bytes, r.node.get());
  if (right > 0) RecordPermute(b.program(), axes, right * row_bytes, r.node.get());
  return LocalValue{r, v.layout, v.global};
}

LocalValue HaloReduce(LocalBuilder& b, const LocalValue& ext, const Sharding& tile_layout,
                      int64_t dim, int64_t left, int64_t right) {
  const AxisList& axes = tile_layout.axes(dim);
  const int64_t tile = ext.value.type().shape[dim] - left - right;
  SPMD_CHECK(!axes.empty() && tile >= left && tile >= right, "internal error: halo reduce of ",
             left, " and ", right, " rows on dim ", dim, " of ", ext.value.type().ToString());
  LocalValue e = ext;
  e.layout = tile_layout;
  // What the neighbours computed for my first `right` rows (their right halo) and my last
  // `left` rows (their left halo).
  auto from_prev = [&] { return Shift(b, SliceRows(b, e, dim, left + tile, right), axes, +1); };
  auto from_next = [&] { return Shift(b, SliceRows(b, e, dim, 0, left), axes, -1); };
  if (left + right > tile) {  // the two sums overlap: add whole-tile paddings of them
    LocalValue out = SliceRows(b, e, dim, left, tile);
    if (right > 0) out = Binary(b, "aten::add.Tensor", out, PadRows(b, from_prev(), dim, 0, tile - right));
    if (left > 0) out = Binary(b, "aten::add.Tensor", out, PadRows(b, from_next(), dim, tile - left, 0));
    return out;
  }
  // [first rows + from_prev | middle | last rows + from_next]. The small edge pieces come
  // first, so that `ext` dies as soon as the middle is copied out of it: at most about two
  // tiles are live, as for the local op that made `ext`.
  std::vector<LocalValue> parts;
  if (right > 0) parts.push_back(Binary(b, "aten::add.Tensor", SliceRows(b, e, dim, left, right), from_prev()));
  LocalValue last =
      left > 0 ? Binary(b, "aten::add.Tensor", SliceRows(b, e, dim, left + tile - left, left), from_next()) : e;
  if (tile - left - right > 0)
    parts.push_back(SliceRows(b, e, dim, left + right, tile - left - right));
  if (left > 0) parts.push_back(last);
  return Concat(b, parts, dim);
}

}  // namespace spmd::partition
