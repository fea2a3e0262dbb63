#include "runtime/tile_ops.h"

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>

#include <cmath>
#include <limits>

namespace spmd::runtime {

c10::Scalar PadValueFor(const at::Tensor& x, double value) {
  c10::ScalarType t = x.scalar_type();
  if (!std::isinf(value) || at::isFloatingType(t) || at::isComplexType(t)) return value;
  if (t == at::kBool) return value > 0;
  return AT_DISPATCH_INTEGRAL_TYPES(t, "mask_pad", [&] {
    return c10::Scalar(value > 0 ? std::numeric_limits<scalar_t>::max()
                                 : std::numeric_limits<scalar_t>::lowest());
  });
}

at::Tensor MaskedFill(const at::Tensor& x, const at::Tensor& mask, double value) {
  if (!c10::isFloat8Type(x.scalar_type())) return x.masked_fill(mask, PadValueFor(x, value));
  // ATen has no masked_fill for FP8: fill the bytes with the value's byte.
  const at::Tensor byte = at::scalar_tensor(value).to(x.scalar_type()).view(at::kByte);
  return x.view(at::kByte).masked_fill(mask, byte.item()).view(x.scalar_type());
}

at::Tensor ValidRows(const at::Tensor& tile, int64_t dim, const DimTiling& tiling, int64_t index) {
  return tile.narrow(dim, 0, tiling.Length(index));
}

at::Tensor TileOf(const at::Tensor& whole, int64_t dim, const DimTiling& tiling, int64_t index) {
  return whole.narrow(dim, tiling.Offset(index), tiling.Length(index));
}

at::Tensor PadTo(const at::Tensor& t, int64_t dim, int64_t size) {
  if (t.size(dim) == size) return t;
  std::vector<int64_t> shape = t.sizes().vec();
  shape[dim] = size;
  at::Tensor out = at::zeros(shape, t.options());
  out.narrow(dim, 0, t.size(dim)).copy_(t);
  return out;
}

at::Tensor PaddedTile(const at::Tensor& whole, int64_t dim, const DimTiling& tiling,
                      int64_t index) {
  at::Tensor piece = TileOf(whole, dim, tiling, index);
  if (piece.size(dim) == tiling.tile_size) return piece.clone(at::MemoryFormat::Contiguous);
  return PadTo(piece, dim, tiling.tile_size);
}

void ReduceInto(at::Tensor& acc, const at::Tensor& v, ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: acc.add_(v); return;
    case ReduceOp::kMax: at::maximum_out(acc, acc, v); return;
    case ReduceOp::kMin: at::minimum_out(acc, acc, v); return;
  }
}

}  // namespace spmd::runtime
