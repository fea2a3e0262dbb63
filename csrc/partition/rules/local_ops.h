// Small local computations that custom lowerings emit (rules/*.cc): arithmetic and masks on
// local values, and each device's offset into a dim tiled over some mesh axes. Each returns a
// LocalValue laid out as its first operand (the lowering that emits it consumes it at once).
#pragma once
#include <cstdint>

#include "partition/local_builder.h"

namespace spmd::partition {

// x op y (an `alpha`-taking binary op such as aten::add.Tensor or aten::sub.Tensor), with the
// result's dtype `out` (default: x's).
LocalValue Binary(LocalBuilder& b, const char* op, const LocalValue& x, const LocalValue& y,
                  int64_t alpha = 1, DType out = DType::kUndefined);
// x * y (aten::mul.Tensor), laid out as x.
LocalValue Multiply(LocalBuilder& b, const LocalValue& x, const LocalValue& y);
// op(x) for an op taking only (self) (aten::exp, aten::log).
LocalValue Unary(LocalBuilder& b, const char* op, const LocalValue& x);
// x op v for an op taking (self, Scalar other) (aten::mul.Scalar, aten::ge.Scalar, ...), with
// the result's dtype `out` (default: x's; comparisons give kBool).
LocalValue WithScalar(LocalBuilder& b, const char* op, const LocalValue& x, int64_t v,
                      DType out = DType::kUndefined);
// A [1] int64 tensor holding, on member i of the group over `axes`, i * tile - left: the global
// index of local index 0 along a dim tiled over `axes` (`left` extra leading elements, a
// halo). An arange sliced per device (no communication).
LocalValue RowOffset(LocalBuilder& b, const AxisList& axes, int64_t tile, int64_t left);
// x && y (bool, broadcast onto x), laid out as x.
LocalValue LogicalAnd(LocalBuilder& b, const LocalValue& x, const LocalValue& y);
// x clamped into [lo, hi].
LocalValue Clamp(LocalBuilder& b, const LocalValue& x, int64_t lo, int64_t hi);
// Where `keep` (bool, broadcast onto x) x, else y (of x's shape), laid out as x.
LocalValue Where(LocalBuilder& b, const LocalValue& keep, const LocalValue& x, const LocalValue& y);
// x converted to `dtype` (aten::_to_copy), laid out as x.
LocalValue CastTo(LocalBuilder& b, const LocalValue& x, DType dtype);
// Where `keep` (bool, broadcast onto x from the right) x, else `other`.
LocalValue WhereElse(LocalBuilder& b, const LocalValue& keep, const LocalValue& x, int64_t other);
inline LocalValue WhereElseZero(LocalBuilder& b, const LocalValue& keep, const LocalValue& x) {
  return WhereElse(b, keep, x, 0);
}

// An index tensor into a dim tiled over `axes` in tiles of `rows`, made local to each device:
// `index` the local position (clamped into [0, rows)), `in_range` whether the global index
// falls in the device's tile (and is not `exclude`, when that is >= 0); a [..., 1] mask when
// `mask_for_rows`, for values with one more (trailing) dim than the indices.
struct LocalIndex {
  LocalValue index;
  LocalValue in_range;
};
LocalIndex IndexIntoTile(LocalBuilder& b, const LocalValue& global_index, const AxisList& axes,
                         int64_t rows, int64_t exclude, bool mask_for_rows);

// arange(start, end, step) as int64, replicated.
LocalValue Range(LocalBuilder& b, int64_t start, int64_t end, int64_t step);
// Entry (i + shift) mod k of the table first + m * step (m < k), on member i of the k of the
// group over `axes`: [1] int64 (first where `axes` tile nothing). With step the tile of a dim
// tiled over `axes`, the global position of that tile's first row.
LocalValue TileTable(LocalBuilder& b, const AxisList& axes, int64_t first, int64_t step,
                     int64_t shift);
// The global positions of the rows of tile (i + shift) mod k of a dim tiled over `axes` in
// tiles of `tile`: [tile] int64 (`column`: [tile, 1]).
LocalValue TilePositions(LocalBuilder& b, const AxisList& axes, int64_t tile, int64_t shift,
                         bool column);
// x with a trailing dim of 1 (aten::unsqueeze_copy).
LocalValue Unsqueezed(LocalBuilder& b, const LocalValue& x);
// x >= y, broadcast (bool).
LocalValue AtLeast(LocalBuilder& b, const LocalValue& x, const LocalValue& y);
}  // namespace spmd::partition
