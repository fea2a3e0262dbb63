// Host-tensor helpers for moving padded tiles around (see DimTiling for the geometry). Shared
// by the collectives and the device-local spmd kernels so that padding is handled one way.
#pragma once
#include <ATen/Tensor.h>

#include "sharding/sharding.h"
#include "sharding/tiling.h"

namespace spmd::runtime {

// The valid rows of a padded tile `tile` (tile `index` of `tiling`) along `dim`: a view.
at::Tensor ValidRows(const at::Tensor& tile, int64_t dim, const DimTiling& tiling, int64_t index);
// Tile `index` of `whole` (extent tiling.extent on `dim`) without padding: a view.
at::Tensor TileOf(const at::Tensor& whole, int64_t dim, const DimTiling& tiling, int64_t index);
// `t` grown to extent `size` on `dim` with zeros at the end; `t` itself if already that long.
at::Tensor PadTo(const at::Tensor& t, int64_t dim, int64_t size);
// Tile `index` of `whole`, zero-padded to tiling.tile_size: a fresh, compact tensor (never a
// view that would keep the whole tensor alive behind a device's smaller accounted buffer).
at::Tensor PaddedTile(const at::Tensor& whole, int64_t dim, const DimTiling& tiling,
                      int64_t index);
// The value padding takes in x's dtype (mask_pad): the infinite identities of max/min reductions
// become an integer dtype's extreme values (true/false for bool).
c10::Scalar PadValueFor(const at::Tensor& x, double value);
// x.masked_fill(mask, PadValueFor(x, value)), for FP8 too (which ATen's masked_fill lacks).
at::Tensor MaskedFill(const at::Tensor& x, const at::Tensor& mask, double value);
// acc = op(acc, v), elementwise, in place.
void ReduceInto(at::Tensor& acc, const at::Tensor& v, ReduceOp op);

}  // namespace spmd::runtime
