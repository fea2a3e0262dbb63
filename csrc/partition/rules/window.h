// What convolution and pooling rules share: the geometry of one spatial dim of a sliding
// window, when it can be partitioned with uniform halos (GSPMD §3.5), the spatial factors, and
// the halo steps of their lowerings.
//
// Output row j reads input rows j*stride - pad + dilation*t, t in [0, kernel). With the input
// (extent L) and output (extent O) both cut into T even tiles of Li = L/T and Oi = O/T rows,
// tile i of the output reads input rows [i*Oi*s - p, ((i+1)*Oi - 1)*s - p + d*(k-1)], so its
// halos beyond its own input rows [i*Li, (i+1)*Li) are
//   left(i)  = i*(Li - Oi*s) + p
//   right(i) = (i+1)*(Oi*s - Li) + d*(k-1) - p - s + 1.
// They are the same on every device exactly when L == O*s (then left = p, right =
// d*(k-1) - p - s + 1): 'same' convolutions at any stride and the usual poolings. Device 0's
// left halo and device T-1's right halo lie beyond the dim: they are the op's padding, and the
// local op runs with padding 0 on that dim. A negative right halo (rows nobody reads) is
// clamped to 0; the local op then still yields exactly Oi rows while p <= d*(k-1) (the extra
// rows are fewer than a stride). Other geometries (e.g. 'valid' convolutions, whose halos grow
// with i) are not partitioned spatially: their spatial factor needs replication.
#pragma once
#include <algorithm>
#include <cstdint>
#include <vector>

#include "partition/halo.h"
#include "partition/rules/rule.h"

namespace spmd::partition {

struct Window {
  int64_t in = 1, out = 1, kernel = 1, stride = 1, dilation = 1, pad = 0;

  int64_t Span() const { return dilation * (kernel - 1) + 1; }
  int64_t Left() const { return pad; }
  int64_t Right() const { return std::max<int64_t>(0, Span() - pad - stride); }
  // Uniform halos, and `out` is the floor-mode output extent (ceil_mode changes nothing).
  bool Tileable() const {
    return stride > 0 && out > 0 && pad <= Span() - 1 && in + 2 * pad >= Span() &&
           out * stride == in && (in + 2 * pad - Span()) / stride + 1 == out;
  }
  // The gradient w.r.t. the input, per input tile, from a halo of the output gradient rather
  // than by overlap-adding (HaloReduce) a gradient of the extended input: input rows
  // [i*Li, (i+1)*Li) receive from output rows [i*Oi - gl, (i+1)*Oi + gr) with at least
  //   gl = floor((span - 1 - p) / s),  gr = ceil(p / s).
  // The local backward runs on those rows with padding gl*s + p and an input of Li rows; it
  // must see exactly the output row count that geometry implies, so more leading rows are
  // taken if needed (each adds one row and 2 to the count; their contributions fall on rows
  // before the tile, which the local op drops), or more trailing rows (contributing after the
  // tile). Fails when the halos would exceed the neighbours' tiles of Oi rows.
  bool GradHalo(int64_t tiles, int64_t* gl, int64_t* gr, int64_t* local_pad) const {
    const int64_t li = in / tiles, oi = out / tiles;
    const int64_t min_left = (Span() - 1 - pad) / stride, min_right = (pad + stride - 1) / stride;
    for (int64_t left = min_left; left <= oi; ++left) {
      const int64_t lpad = left * stride + pad, room = li + 2 * lpad - Span();
      if (room < 0) continue;
      const int64_t right = room / stride + 1 - oi - left;  // trailing rows the count implies
      if (right < min_right) continue;
      if (right > oi) return false;
      *gl = left;
      *gr = right;
      *local_pad = lpad;
      return true;
    }
    return false;
  }
  // Halos come from direct neighbours only: tiles of at least max(Left, Right) rows.
  int64_t MaxTiles() const {
    int64_t halo = std::max(Left(), Right());
    return halo == 0 ? 0 : in / halo;
  }
};

// A factor for one spatial dim: windowed when `w` is tileable (and `allow`), else
// need-replication.
inline int AddSpatialFactor(ShardingRule& rule, const Window& w, bool allow = true) {
  if (!allow || !w.Tileable()) return rule.AddFactor(w.out, FactorKind::kNeedReplication);
  int f = rule.AddFactor(w.out);
  rule.factors[f].windowed = true;
  rule.factors[f].max_tiles = w.MaxTiles();
  return f;
}

// A per-spatial-dim int list argument: a single value applies to every spatial dim, an empty
// list (pooling's default stride) gives `fallback`.
inline std::vector<int64_t> SpatialList(const ir::Node& node, const char* name, size_t spatial,
                                        const std::vector<int64_t>& fallback) {
  std::vector<int64_t> v = IntListArg(node, ArgIndex(node, name));
  if (v.empty()) return fallback;
  if (v.size() == 1) v.assign(spatial, v[0]);
  return v;
}

// The spatial dims of a lowering: tensor dim, factor and window per spatial dim.
struct SpatialDims {
  int64_t first_dim = 0;  // tensor dim of spatial dim 0
  std::vector<int> factors;
  std::vector<Window> windows;

  bool Sharded(const LocalBuilder& b, size_t d) const {
    return !b.factor_axes()[factors[d]].empty();
  }
  bool AnySharded(const LocalBuilder& b) const {
    for (size_t d = 0; d < factors.size(); ++d)
      if (Sharded(b, d)) return true;
    return false;
  }
  // x (an input tile) extended by its halos on every sharded spatial dim, filled with `value`
  // beyond the ends; with `exchange` false the halo rows are just `value` (for backward ops
  // that read only the input's shape: no communication). Sets `padding` to 0 on those dims.
  LocalValue Extend(LocalBuilder& b, LocalValue x, std::vector<int64_t>& padding, double value,
                    bool exchange = true) const {
    for (size_t d = 0; d < factors.size(); ++d) {
      if (!Sharded(b, d)) continue;
      const Window& w = windows[d];
      int64_t dim = first_dim + static_cast<int64_t>(d);
      x = exchange ? HaloExchange(b, x, dim, w.Left(), w.Right(), value)
                   : PadRows(b, x, dim, w.Left(), w.Right(), value);
      padding[d] = 0;
    }
    return x;
  }
  // The adjoint of Extend for a gradient computed on the extended tile (reverse order).
  LocalValue Reduce(LocalBuilder& b, LocalValue ext, const Sharding& tile_layout) const {
    for (size_t d = factors.size(); d-- > 0;) {
      if (!Sharded(b, d)) continue;
      ext = HaloReduce(b, ext, tile_layout, first_dim + static_cast<int64_t>(d), windows[d].Left(),
                       windows[d].Right());
    }
    return ext;
  }
};

// The node's op on local operands with `args`, where result `o` has local type `types[o]`
// (an extended tile, unlike LocalBuilder::EmitNodeOp's result-layout shapes).
inline std::vector<LocalValue> EmitWithTypes(LocalBuilder& b, const std::vector<LocalValue>& ops,
                                             std::vector<ir::Arg> args,
                                             std::vector<TensorType> types) {
  std::vector<ir::Value> inputs;
  for (const LocalValue& v : ops) inputs.push_back(v.value);
  const ir::Node& n = b.node();
  std::vector<Sharding> layouts;
  for (int o = 0; o < n.num_outputs(); ++o) layouts.push_back(b.result_layout(o));
  ir::NodePtr node =
      b.program().Emit(n.op(), std::move(inputs), std::move(args), std::move(types), layouts);
  std::vector<LocalValue> results;
  for (int o = 0; o < n.num_outputs(); ++o)
    results.push_back(LocalValue{ir::Value{node, o}, layouts[o], n.output(o)});
  return results;
}

// The local type of result `o` under its result layout.
inline TensorType LocalResultType(const LocalBuilder& b, int o) {
  const TensorType& g = b.node().output(o);
  if (g.dtype == DType::kUndefined) return g;
  return TensorType{g.dtype, LocalShape(g.shape, b.result_layout(o))};
}

}  // namespace spmd::partition
