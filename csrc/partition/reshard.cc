// Resharding: the collective sequence that moves a value from its layout to another, in the
// order GSPMD's reshard uses, cheapest first:
//   1. pending partial sums: reduce-scatter onto a dim the target tiles with that axis next,
//      all-reduce for the rest;
//   2. an axis list moving from one dim to another (each dim tiled by it alone): all-to-all;
//   3. axes leaving a dim: all-gather;
//   4. axes joining a dim: a local slice of what the device already holds (no communication).
// Uneven tilings only take the short paths when the tile boundaries line up; otherwise the dim
// is gathered whole and re-sliced, which is always correct.
#include <algorithm>

#include "core/error.h"
#include "ir/internal_ops.h"
#include "partition/local_builder.h"

namespace spmd::partition {

namespace {

using ir::Arg;

const ir::InternalOps& Ops() { return ir::InternalOps::Get(); }

Arg AxesArg(const AxisList& axes) { return Arg::IntList(std::vector<int64_t>(axes.begin(), axes.end())); }

bool StartsWith(const AxisList& a, const AxisList& prefix) {
  return a.size() >= prefix.size() && std::equal(prefix.begin(), prefix.end(), a.begin());
}

AxisList CommonPrefix(const AxisList& a, const AxisList& b) {
  AxisList c;
  for (size_t i = 0; i < a.size() && i < b.size() && a[i] == b[i]; ++i) c.push_back(a[i]);
  return c;
}

// Extent of dim d that the device-local tile over `axes` is cut from, when the tiling is even:
// the global size divided by the tiles of `axes`.
int64_t EvenExtent(const LocalValue& v, int64_t d, const AxisList& axes, const Mesh& mesh,
                   bool* even) {
  int64_t k = AxesSize(mesh, axes);
  int64_t size = v.global.shape[d];
  *even = size % k == 0;
  return size / k;
}

// Whether tiling dim d by `outer` and then each outer tile by `inner` (locally, as a
// reduce-scatter or a shard_slice of the outer tile does) gives the same tiles as tiling it by
// outer+inner globally. With padding it does not: 10 rows over 2 then 2 gives [0,3) [3,5)
// inside the first half, where the global 4-way tiling has [0,3) [3,6).
bool NestedTilingMatches(const LocalValue& v, int64_t d, const AxisList& outer,
                         const AxisList& inner, const Mesh& mesh) {
  int64_t k_outer = AxesSize(mesh, outer);
  return k_outer == 1 || v.global.shape[d] % (k_outer * AxesSize(mesh, inner)) == 0;
}

// Carries `v` to `layout` through one internal op.
LocalValue Step(ProgramBuilder& b, const LocalValue& v, const ir::OpInfo* op, std::vector<Arg> attrs,
                const Sharding& layout, const char* kind, const AxisList& axes) {
  TensorType out{v.global.dtype, LocalShape(v.global.shape, layout)};
  ir::Value r = b.EmitInternal(op, v.value, std::move(attrs), out, layout, kind, axes);
  return LocalValue{r, layout, v.global};
}

LocalValue AllGather(ProgramBuilder& b, const LocalValue& v, int64_t d, const AxisList& axes,
                     int64_t size, const AxisList& remaining) {
  Sharding layout = v.layout.WithDimAxes(d, remaining);
  return Step(b, v, Ops().all_gather, {Arg::Int(d), AxesArg(axes), Arg::Int(size)}, layout,
              "all-gather", axes);
}

LocalValue ShardSlice(ProgramBuilder& b, const LocalValue& v, int64_t d, const AxisList& axes,
                      int64_t size, const AxisList& result_axes) {
  Sharding layout = v.layout.WithDimAxes(d, result_axes);
  return Step(b, v, Ops().shard_slice, {Arg::Int(d), AxesArg(axes), Arg::Int(size)}, layout,
              nullptr, axes);
}

LocalValue ResolvePartial(ProgramBuilder& b, LocalValue v, const Sharding& target) {
  const Mesh& mesh = v.layout.mesh();
  AxisList pending = v.layout.partial_axes();
  ReduceOp op = v.layout.partial_op();
  // Reduce-scatter where the target tiles a dim with partial axes next: each device keeps only
  // the reduced tile it will hold anyway.
  for (int64_t d = 0; d < v.global.rank() && !pending.empty(); ++d) {
    const AxisList& have = v.layout.axes(d);
    const AxisList& want = target.axes(d);
    if (!StartsWith(want, have)) continue;
    AxisList scatter;
    for (size_t i = have.size(); i < want.size(); ++i) {
      if (std::find(pending.begin(), pending.end(), want[i]) == pending.end()) break;
      scatter.push_back(want[i]);
    }
    if (scatter.empty() || op != ReduceOp::kSum) continue;
    bool even = true;
    int64_t extent = have.empty() ? v.global.shape[d] : EvenExtent(v, d, have, mesh, &even);
    if (!even || !NestedTilingMatches(v, d, have, scatter, mesh)) continue;
    AxisList new_axes = have;
    new_axes.insert(new_axes.end(), scatter.begin(), scatter.end());
    AxisList still;
    for (int a : pending)
      if (std::find(scatter.begin(), scatter.end(), a) == scatter.end()) still.push_back(a);
    Sharding layout = v.layout.WithPartial(still, op).WithDimAxes(d, new_axes);
    v = Step(b, v, Ops().reduce_scatter,
             {Arg::Int(d), AxesArg(scatter), Arg::Int(static_cast<int64_t>(op)), Arg::Int(extent)},
             layout, "reduce-scatter", scatter);
    pending = still;
  }
  if (!pending.empty()) {
    v = Step(b, v, Ops().all_reduce, {AxesArg(pending), Arg::Int(static_cast<int64_t>(op))},
             v.layout.WithoutPartial(), "all-reduce", pending);
  }
  return v;
}

// One all-to-all for the minor axes of dim `from` that dim `to` needs next: what stays of
// `from` is a prefix of its target tiling, `to`'s tiling a prefix of its own, and the moving
// axes follow it there (each dim's nested tiles must match the global tiling: even
// extents). The simplest case moves a dim's only axes to an untiled dim; FSDP's batch-sharded
// activations meeting a hidden-sharded embedding move fsdp from the hidden dim to the batch
// dim behind its data axis this way instead of gathering the whole batch.
bool TryAllToAll(ProgramBuilder& b, LocalValue& v, const Sharding& target) {
  const Mesh& mesh = v.layout.mesh();
  for (int64_t from = 0; from < v.global.rank(); ++from) {
    const AxisList& have_from = v.layout.axes(from);
    const AxisList keep = CommonPrefix(have_from, target.axes(from));
    if (keep.size() == have_from.size()) continue;
    const AxisList moving(have_from.begin() + keep.size(), have_from.end());
    for (int64_t to = 0; to < v.global.rank(); ++to) {
      const AxisList& have_to = v.layout.axes(to);
      const AxisList& want_to = target.axes(to);
      if (to == from || !StartsWith(want_to, have_to) ||
          !std::equal(moving.begin(), moving.end(), want_to.begin() + have_to.size(),
                      want_to.begin() + std::min(want_to.size(), have_to.size() + moving.size())) ||
          want_to.size() < have_to.size() + moving.size())
        continue;
      bool even_to = true, even_from = true;
      const int64_t split = have_to.empty() ? v.global.shape[to]
                                            : EvenExtent(v, to, have_to, mesh, &even_to);
      const int64_t concat = keep.empty() ? v.global.shape[from]
                                          : EvenExtent(v, from, keep, mesh, &even_from);
      if (!even_to || !even_from || !NestedTilingMatches(v, to, have_to, moving, mesh) ||
          !NestedTilingMatches(v, from, keep, moving, mesh))
        continue;
      AxisList joined = have_to;
      joined.insert(joined.end(), moving.begin(), moving.end());
      Sharding layout = v.layout.WithDimAxes(from, keep).WithDimAxes(to, joined);
      v = Step(b, v, Ops().all_to_all,
               {Arg::Int(to), Arg::Int(from), AxesArg(moving), Arg::Int(split), Arg::Int(concat)},
               layout, "all-to-all", moving);
      return true;
    }
  }
  return false;
}

}  // namespace

Shape LocalShape(const Shape& global, const Sharding& layout) {
  if (!layout.valid()) return global;
  return layout.ShardShape(global);
}

LocalValue Reshard(ProgramBuilder& b, const LocalValue& input, const Sharding& target_in) {
  const MeshPtr& mesh_ptr = b.mesh();
  const Mesh& mesh = *mesh_ptr;
  int64_t rank = input.global.rank();
  Sharding target = target_in.valid() ? target_in : Sharding::Replicated(mesh_ptr, rank);
  LocalValue v = input;
  if (!v.layout.valid()) v.layout = Sharding::Replicated(mesh_ptr, rank);
  SPMD_CHECK(v.layout.mesh() == mesh && target.mesh() == mesh,
             "internal error: resharding between different meshes");
  SPMD_CHECK(!target.IsPartial(), "internal error: a reshard target cannot be partial");
  if (v.layout == target) return v;
  if (const LocalValue* cached = b.FindReshard(v.value, v.layout, target)) return *cached;
  const Sharding source = v.layout;

  if (v.layout.IsPartial()) v = ResolvePartial(b, v, target);
  while (v.layout != target && TryAllToAll(b, v, target)) {
  }

  // Axes leaving a dim.
  for (int64_t d = 0; d < rank; ++d) {
    const AxisList have = v.layout.axes(d);
    AxisList keep = CommonPrefix(have, target.axes(d));
    if (keep.size() == have.size()) continue;
    AxisList drop(have.begin() + keep.size(), have.end());
    bool even = true;
    int64_t extent = keep.empty() ? v.global.shape[d] : EvenExtent(v, d, keep, mesh, &even);
    bool aligned = even && v.global.shape[d] % AxesSize(mesh, have) == 0;
    if (keep.empty() || aligned) {
      v = AllGather(b, v, d, drop, extent, keep);
    } else {
      v = AllGather(b, v, d, have, v.global.shape[d], {});
    }
  }
  // Axes joining a dim: slice locally.
  for (int64_t d = 0; d < rank; ++d) {
    const AxisList have = v.layout.axes(d);
    const AxisList& want = target.axes(d);
    if (have == want) continue;
    AxisList extra(want.begin() + have.size(), want.end());
    bool even = true;
    int64_t extent = have.empty() ? v.global.shape[d] : EvenExtent(v, d, have, mesh, &even);
    if (have.empty() || (even && NestedTilingMatches(v, d, have, extra, mesh))) {
      v = ShardSlice(b, v, d, extra, extent, want);
    } else {
      v = AllGather(b, v, d, have, v.global.shape[d], {});
      v = ShardSlice(b, v, d, want, v.global.shape[d], want);
    }
  }
  SPMD_CHECK(v.layout == target, "internal error: reshard reached ", v.layout.ToNamedString(),
             " instead of ", target.ToNamedString());
  b.AddReshard(input.value, source, target, v);
  return v;
}

LocalValue MaskPadding(ProgramBuilder& b, const LocalValue& input, const std::vector<int>& dims,
                       double value) {
  LocalValue v = input;
  for (int d : dims) {
    const AxisList& axes = v.layout.axes(d);
    if (axes.empty() || v.global.shape[d] % AxesSize(v.layout.mesh(), axes) == 0) continue;
    v = Step(b, v, Ops().mask_pad,
             {Arg::Int(d), AxesArg(axes), Arg::Int(v.global.shape[d]), Arg::Double(value)},
             v.layout, nullptr, axes);
  }
  return v;
}

}  // namespace spmd::partition
