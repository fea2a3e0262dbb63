// Halo exchange and its adjoint, for the lowerings of windowed ops (convolution, pooling) on a
// dim tiled evenly over some mesh axes (rule.h, Factor::windowed).
//
// A local sliding-window op needs, besides its own tile of input rows, `left` rows of the
// previous tile and `right` rows of the next one (GSPMD §3.5). At the ends of the dim there is
// no neighbour: those rows are the op's padding, filled with the padding value (0, or -inf for
// max pooling), so the local op runs with no padding on that dim.
//
// The backward pass computes, on the extended tile, gradients that partly belong to the
// neighbours' rows: HaloReduce sends them back and adds them there ("overlap-add"). It is the
// adjoint of HaloExchange: for any window sizes, strides and dilations, gradient = local
// backward on the extended tile, then HaloReduce.
#pragma once
#include <cstdint>
#include <vector>

#include "partition/local_builder.h"

namespace spmd::partition {

// v's tile extended to [previous member's last `left` rows | tile | next member's first `right`
// rows] on `dim` (`value` beyond the ends of the dim). v must tile `dim` evenly, with tiles of at
// least max(left, right) rows. One spmd::halo_exchange, recorded in the program statistics as
// one collective-permute per non-empty side. The result keeps v's (nominal) layout: it is an
// intermediate of a lowering, never resharded.
LocalValue HaloExchange(LocalBuilder& b, const LocalValue& v, int64_t dim, int64_t left,
                        int64_t right, double value);

// The adjoint: `ext` holds a tile extended by `left` and `right` rows on `dim` (as made by
// HaloExchange, but holding contributions, e.g. gradients). Returns the tile, with the previous
// member's contributions to its first `right` rows and the next member's to its last `left`
// rows added; contributions beyond the ends of the dim are dropped. `tile_layout` is the
// layout of the result (may be partial: the sum is linear).
LocalValue HaloReduce(LocalBuilder& b, const LocalValue& ext, const Sharding& tile_layout,
                      int64_t dim, int64_t left, int64_t right);

// x's tiles moved `shift` members along `axes`, cyclically: member i receives member
// (i - shift) mod k's buffer. One spmd::collective_permute (none when shift is 0 mod k),
// recorded as one collective-permute of x's bytes. The result keeps x's layout: the caller
// places the moved rows.
LocalValue RotateTiles(LocalBuilder& b, const LocalValue& x, const AxisList& axes, int64_t shift);
// x's tiles moved by an explicit permutation: member pairs[2i] sends to pairs[2i + 1].
LocalValue PermuteTiles(LocalBuilder& b, const LocalValue& x, const AxisList& axes,
                        std::vector<int64_t> pairs);

// Helpers for multi-op lowerings on local values (the layout and global type are `like`'s).
LocalValue SliceRows(LocalBuilder& b, const LocalValue& x, int64_t dim, int64_t start,
                     int64_t length);
// x with `before` and `after` rows of `value` added on `dim` (aten::constant_pad_nd).
LocalValue PadRows(LocalBuilder& b, const LocalValue& x, int64_t dim, int64_t before, int64_t after,
                   double value = 0);
LocalValue Concat(LocalBuilder& b, const std::vector<LocalValue>& parts, int64_t dim);

}  // namespace spmd::partition
