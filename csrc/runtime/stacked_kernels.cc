// Stacked kernels of the partitioner-inserted spmd:: ops (ir/internal_ops.h): every device's
// shard is a row of one tensor (stacked.h), so a collective is a few tensor operations on the
// rows, whatever the device count:
//   - the rows arranged by group, [G, k, *local] (a strided view when the groups are regular,
//     as mesh axes make them), then
//   - all-reduce: the members reduced (in member order, as the per-device kernels do);
//     all-gather: the member dim merged into the gathered dim; reduce-scatter: an all-reduce
//     whose result is cut into member tiles; all-to-all: the split dim cut into member tiles
//     and swapped with the member dim; collective-permute: a gather over the member dim.
// Results hold one row per group (all-gather, all-reduce: members hold the same value) or per
// member. Same contract, checks and metrics as the per-device kernels (collective_kernels.cc),
// which test/python/test_collectives.py holds both to.
#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <mutex>
#include <unordered_map>

#include "core/error.h"
#include "ir/internal_attrs.h"
#include "ir/internal_ops.h"
#include "runtime/collectives.h"
#include "runtime/internal_kernels.h"
#include "runtime/span_kernels.h"
#include "runtime/stacked.h"
#include "runtime/tile_ops.h"

namespace spmd::runtime {

namespace {

// One execution of an spmd op on a stacked input.
struct Call {
  const ir::Node& node;
  ir::SpmdAttrs attrs;
  MeshGroups groups;
  const Stacked& x;
  at::Tensor shard;  // one device's input (for checks and byte counts)
  Grouped by_group;  // x's rows by distinct group

  const char* name() const { return node.op()->name.c_str(); }
  int64_t k() const { return groups.group_size(); }
  int64_t num_groups() const { return by_group.group_map->rows; }  // distinct ones
  const at::Tensor& rows() const { return by_group.rows[0]; }     // [U, k, *local]
};

Call Prepare(const ir::Node& node, const std::vector<const Stacked*>& inputs) {
  const std::string& op = node.op()->qualified;
  SPMD_CHECK(!node.shardings().empty() && node.shardings()[0].valid(), op,
             " has no output sharding to take its mesh from");
  SPMD_CHECK(inputs.size() == 1, op, " takes one tensor, got ", inputs.size());
  const Mesh& mesh = node.shardings()[0].mesh();
  const Stacked& x = *inputs[0];
  SPMD_CHECK(mesh.size() == x.map->num_devices(), op, ": the mesh has ", mesh.size(),
             " devices but the device set has ", x.map->num_devices());
  ir::SpmdAttrs attrs = ir::SpmdAttrs::Read(*node.op(), node.args());
  MeshGroups groups(mesh, attrs.axes);
  const ir::InternalOps& ops = ir::InternalOps::Get();
  const bool sums = (node.op() == ops.all_reduce || node.op() == ops.reduce_scatter) &&
                    attrs.op == ReduceOp::kSum;
  SPMD_CHECK(!x.summed || sums, "internal error: ", op, " got an already summed input");
  Grouped by_group = ByGroup({&x}, groups);
  return Call{node, std::move(attrs), std::move(groups), x, x.Row(0), std::move(by_group)};
}

// The members of each group reduced: [G, *local], in member order as ReduceGroup does. The
// result keeps the input's memory layout: a transposed gradient is summed as it lies in
// memory (contiguous reads, where reading it across strides through memory), and stays
// transposed.
at::Tensor ReduceMembers(const at::Tensor& by_group, ReduceOp op) {
  at::Tensor acc = by_group.select(1, 0).clone(at::MemoryFormat::Preserve);
  for (int64_t i = 1; i < by_group.size(1); ++i) ReduceInto(acc, by_group.select(1, i), op);
  return acc;
}

// [G, ..., k*s at dim+1, ...] -> [G * k, ..., s, ...]: member i of group g gets tile i.
at::Tensor SplitIntoMembers(const at::Tensor& t, int64_t dim, int64_t k) {
  at::Tensor split = t.unflatten(dim + 1, {k, t.size(dim + 1) / k}).movedim(dim + 1, 1);
  return split.flatten(0, 1);
}

std::vector<Stacked> AllGather(const Call& c) {
  const int64_t dim = c.attrs.dim, size = c.attrs.size;
  CheckCollectiveDim("all_gather", "dim", dim, c.shard);
  CheckCollectiveExtent("all_gather", "dim", c.shard, dim, DimTiling(size, c.k()).tile_size);
  RecordCollective(CollectiveKind::kAllGather, c.shard);
  // The members' padded tiles side by side: global row j of the dim is at j (padding last).
  at::Tensor merged = c.rows().movedim(1, dim + 1).flatten(dim + 1, dim + 2);
  if (merged.size(dim + 1) != size) merged = merged.narrow(dim + 1, 0, size);
  return {Stacked{merged.contiguous(), c.by_group.group_map}};
}

std::vector<Stacked> AllReduce(const Call& c) {
  RecordCollective(CollectiveKind::kAllReduce, c.shard);
  if (c.x.summed) return {Stacked{c.x.rows, c.x.map}};  // computed summed: only counted here
  if (c.k() == 1) return {c.x};  // nothing to reduce; values are immutable
  return {Stacked{ReduceMembers(c.rows(), c.attrs.op),
                  c.by_group.group_map}};
}

std::vector<Stacked> ReduceScatter(const Call& c) {
  const int64_t dim = c.attrs.dim, size = c.attrs.size, k = c.k();
  CheckCollectiveDim("reduce_scatter", "dim", dim, c.shard);
  CheckCollectiveExtent("reduce_scatter", "dim", c.shard, dim, size);
  RecordCollective(CollectiveKind::kReduceScatter, c.shard);
  // Computed summed (every member holds its group's sum), or summed here.
  at::Tensor reduced = c.x.summed ? c.rows().select(1, 0) : ReduceMembers(c.rows(), c.attrs.op);
  at::Tensor padded = PadTo(reduced, dim + 1, DimTiling(size, k).tile_size * k);
  return {Stacked{SplitIntoMembers(padded, dim, k).contiguous(),
                  c.by_group.member_map}};
}

std::vector<Stacked> AllToAll(const Call& c) {
  const ir::SpmdAttrs& a = c.attrs;
  const int64_t k = c.k(), s = a.split_dim, t = a.concat_dim;
  CheckCollectiveDim("all_to_all", "split_dim", s, c.shard);
  CheckCollectiveDim("all_to_all", "concat_dim", t, c.shard);
  SPMD_CHECK_VALUE(s != t, "all_to_all: split_dim and concat_dim must differ");
  CheckCollectiveExtent("all_to_all", "split_dim", c.shard, s, a.split_size);
  CheckCollectiveExtent("all_to_all", "concat_dim", c.shard, t, DimTiling(a.concat_size, k).tile_size);
  RecordCollective(CollectiveKind::kAllToAll, c.shard);
  // [G, i, *local] with the split dim padded to k tiles and cut: [G, i, .., j, ss, .., cs, ..].
  at::Tensor x = PadTo(c.rows(), s + 2, DimTiling(a.split_size, k).tile_size * k);
  x = x.unflatten(s + 2, {k, x.size(s + 2) / k});
  // Dim positions now: 0 G, 1 i, then the local dims with j inserted before the split tile.
  const int64_t j_pos = s + 2, t_pos = t + 2 + (t > s ? 1 : 0);
  // Target order: G, j, the local dims with i right before the concat tile (merged with it).
  std::vector<int64_t> order{0, j_pos};
  for (int64_t p = 2; p < x.dim(); ++p) {
    if (p == j_pos) continue;
    if (p == t_pos) order.push_back(1);
    order.push_back(p);
  }
  at::Tensor y = x.permute(order);  // [G, j, .., ss, .., i, cs, ..]
  const int64_t i_pos = std::find(order.begin(), order.end(), 1) - order.begin();
  y = y.flatten(i_pos, i_pos + 1);  // the members' concat tiles side by side
  if (y.size(i_pos) != a.concat_size) y = y.narrow(i_pos, 0, a.concat_size);
  return {Stacked{y.flatten(0, 1).contiguous(), c.by_group.member_map}};
}

// Member dst of every group receives member src's shard ((src, dst) in `pairs`); members
// receiving nothing get `fill` (zeros for a collective-permute). Input [G, k, ...].
at::Tensor Permuted(const at::Tensor& by_group, const PermutePairs& pairs, double fill) {
  const int64_t k = by_group.size(1);
  std::vector<int64_t> source(k, k);  // k: the fill row
  for (const auto& [src, dst] : pairs) source[dst] = src;
  at::Tensor from = by_group;
  if (std::find(source.begin(), source.end(), k) != source.end()) {
    std::vector<int64_t> fill_shape = by_group.sizes().vec();
    fill_shape[1] = 1;
    from = at::cat({by_group, at::full(fill_shape, fill, by_group.options())}, 1);
  }
  return from.index_select(1, at::tensor(source, at::kLong));
}

void CheckPairs(const PermutePairs& pairs, int64_t k) {
  std::vector<bool> receives(k, false);
  for (const auto& [src, dst] : pairs) {
    SPMD_CHECK_VALUE(src >= 0 && src < k && dst >= 0 && dst < k, "collective_permute: pair (",
                     src, ", ", dst, ") is out of range for groups of ", k);
    SPMD_CHECK_VALUE(!receives[dst], "collective_permute: member ", dst,
                     " receives from more than one source");
    receives[dst] = true;
  }
}

std::vector<Stacked> CollectivePermute(const Call& c) {
  CheckPairs(c.attrs.pairs, c.k());
  RecordCollective(CollectiveKind::kPermute, c.shard);
  return {Stacked{Permuted(c.rows(), c.attrs.pairs, 0.0).flatten(0, 1),
                  c.by_group.member_map}};
}

// A result that depends on the input row and on the device's member index: one row per
// distinct (input row, member index), computed by fn(input rows, the input row of each result
// row, the member index of each result row). The input rows are passed as they are (not one
// copy per result row: slicing a replicated value over 64 members must not first copy it 64
// times).
template <typename Fn>
Stacked PerMember(const Call& c, Fn fn) {
  const int64_t n = c.x.map->num_devices();
  std::vector<int64_t> keys(2 * n);
  for (int64_t d = 0; d < n; ++d) {
    keys[2 * d] = c.x.map->row_of[d];
    keys[2 * d + 1] = c.groups.IndexOf(d);
  }
  std::vector<int64_t> first_device;
  RowMapPtr map = MapOfKeys(keys, 2, &first_device);
  std::vector<int64_t> source(map->rows), member(map->rows);
  for (int64_t r = 0; r < map->rows; ++r) {
    source[r] = c.x.map->row_of[first_device[r]];
    member[r] = c.groups.IndexOf(first_device[r]);
  }
  return Stacked{fn(c.x.rows, source, member), map};
}

// t[source[r], member[r]] for each r, stacked ([R, ...] of t [S, k, ...]): from one source row
// an index_select of its members (the identity among them: a view), else a gather.
at::Tensor PickTiles(const at::Tensor& t, const std::vector<int64_t>& source,
                     const std::vector<int64_t>& member) {
  const bool one_source =
      std::all_of(source.begin(), source.end(), [&](int64_t s) { return s == source[0]; });
  if (!one_source)
    return t.index({at::tensor(source, at::kLong), at::tensor(member, at::kLong)});
  at::Tensor tiles = t.select(0, source[0]);  // [k, ...]
  return SelectRows(tiles, member).contiguous();
}

std::vector<Stacked> ShardSlice(const Call& c) {
  const DimTiling tiling(c.attrs.size, c.k());
  const int64_t dim = c.attrs.dim;
  SPMD_CHECK_VALUE(dim >= 0 && dim < c.shard.dim() && c.shard.size(dim) == tiling.extent,
                   c.node.op()->qualified, ": each device's input must have extent ",
                   tiling.extent, " on dim ", dim, ", got ", c.shard.sizes());
  return {PerMember(c, [&](const at::Tensor& rows, const std::vector<int64_t>& source,
                           const std::vector<int64_t>& member) {
    // Each input row's dim cut into member tiles ([S, k, ..., s, ...], a view), then for result
    // row r tile member[r] of input row source[r].
    at::Tensor tiles = PadTo(rows, dim + 1, tiling.tile_size * tiling.count)
                           .unflatten(dim + 1, {tiling.count, tiling.tile_size})
                           .movedim(dim + 1, 1);
    return PickTiles(tiles, source, member);
  })};
}

// Piece `part` of tile (member + shift) mod k of an even extent (ring_slice): ShardSlice's
// pick, shifted, over k x parts pieces.
std::vector<Stacked> RingSlice(const Call& c) {
  const ir::SpmdAttrs& a = c.attrs;
  const int64_t pieces = c.k() * a.parts, dim = a.dim;
  SPMD_CHECK_VALUE(dim >= 0 && dim < c.shard.dim() && c.shard.size(dim) == a.size,
                   c.node.op()->qualified, ": each device's input must have extent ", a.size,
                   " on dim ", dim, ", got ", c.shard.sizes());
  return {PerMember(c, [&](const at::Tensor& rows, const std::vector<int64_t>& source,
                           const std::vector<int64_t>& member) {
    at::Tensor tiles = rows.unflatten(dim + 1, {pieces, a.size / pieces}).movedim(dim + 1, 1);
    std::vector<int64_t> picked(member.size());
    for (size_t r = 0; r < member.size(); ++r)
      picked[r] = (member[r] + a.shift) % c.k() * a.parts + a.part;
    return PickTiles(tiles, source, picked);
  })};
}

// Each row's dim put back in order from ring order (ring_unroll): rolled by its member's tiles.
std::vector<Stacked> RingUnroll(const Call& c) {
  const int64_t tile = c.attrs.size / c.k(), dim = c.attrs.dim;
  SPMD_CHECK_VALUE(dim >= 0 && dim < c.shard.dim() && c.shard.size(dim) == c.attrs.size,
                   c.node.op()->qualified, ": each device's input must have extent ",
                   c.attrs.size, " on dim ", dim, ", got ", c.shard.sizes());
  return {PerMember(c, [&](const at::Tensor& rows, const std::vector<int64_t>& source,
                           const std::vector<int64_t>& member) {
    std::vector<at::Tensor> out;
    for (size_t r = 0; r < member.size(); ++r)
      out.push_back(at::roll(rows.select(0, source[r]), {member[r] * tile}, {dim}));
    return at::stack(out);
  })};
}

std::vector<Stacked> MaskPad(const Call& c) {
  const DimTiling tiling(c.attrs.size, c.k());
  const int64_t dim = c.attrs.dim;
  SPMD_CHECK_VALUE(dim >= 0 && dim < c.shard.dim() && c.shard.size(dim) == tiling.tile_size,
                   c.node.op()->qualified, ": each device's input must have extent ",
                   tiling.tile_size, " on dim ", dim, ", got ", c.shard.sizes());
  if (tiling.IsEven()) return {c.x};  // no padding: the input is already the result
  return {PerMember(c, [&](const at::Tensor& input_rows, const std::vector<int64_t>& source,
                           const std::vector<int64_t>& member) {
    const at::Tensor rows = SelectRows(input_rows, source);
    // pad[r, p] = position p of the dim is padding in row r's tile.
    std::vector<int64_t> valid(member.size());
    for (size_t r = 0; r < member.size(); ++r) valid[r] = tiling.Length(member[r]);
    at::Tensor lengths = at::tensor(valid, at::kLong).view({-1, 1});
    at::Tensor pad = at::arange(tiling.tile_size, at::kLong).view({1, -1}) >= lengths;
    std::vector<int64_t> shape(rows.dim(), 1);
    shape[0] = rows.size(0);
    shape[dim + 1] = tiling.tile_size;
    return MaskedFill(rows, pad.view(shape), c.attrs.value);
  })};
}

std::vector<Stacked> HaloExchange(const Call& c) {
  const ir::SpmdAttrs& a = c.attrs;
  SPMD_CHECK_VALUE(a.dim >= 0 && a.dim < c.shard.dim(), "halo_exchange: dim ", a.dim,
                   " is out of range for a tensor of rank ", c.shard.dim());
  const int64_t tile = c.shard.size(a.dim), k = c.k(), d = a.dim + 2;
  SPMD_CHECK_VALUE(a.left <= tile && a.right <= tile, "halo_exchange: halos of ", a.left, " and ",
                   a.right, " reach beyond the direct neighbours' tiles of ", tile);
  at::Tensor x = c.rows();  // [G, k, ...]
  // Each edge travels as one collective-permute (none when it is empty or has no neighbour).
  auto edge = [&](int64_t start, int64_t length, int64_t shift) {
    at::Tensor rows = x.narrow(d, start, length);
    PermutePairs pairs;
    for (int64_t i = 0; i < k; ++i)
      if (i + shift >= 0 && i + shift < k) pairs.emplace_back(i, i + shift);
    if (length > 0 && !pairs.empty())
      RecordCollective(CollectiveKind::kPermute, c.shard.narrow(a.dim, start, length));
    return Permuted(rows, pairs, a.value);
  };
  at::Tensor left = edge(tile - a.left, a.left, +1);  // from the previous member
  at::Tensor right = edge(0, a.right, -1);            // from the next member
  return {Stacked{at::cat({left, x, right}, d).flatten(0, 1),
                  c.by_group.member_map}};
}

using Kernel = std::vector<Stacked> (*)(const Call&);

// The kernel of each spmd op, by op (RunMeshKernel).
std::unordered_map<const ir::OpInfo*, Kernel>& KernelsByOp() {
  static auto* kernels = new std::unordered_map<const ir::OpInfo*, Kernel>();
  return *kernels;
}
std::mutex& KernelsMutex() {
  static auto* mu = new std::mutex();
  return *mu;
}

void Register(const ir::OpInfo* op, Kernel kernel) {
  {
    std::lock_guard<std::mutex> lock(KernelsMutex());
    KernelsByOp()[op] = kernel;
  }
  // Across processes the op goes through span_kernels.h, which calls RunMeshKernel.
  RegisterStackedKernel(op->qualified, [kernel](const ir::Node& node,
                                                const std::vector<const Stacked*>& inputs) {
    if (std::shared_ptr<ProcessSpan> span = ProcessSpan::Current())
      return RunSpmdOpAcrossProcesses(node, inputs, *span);
    return kernel(Prepare(node, inputs));
  });
}

}  // namespace

std::vector<Stacked> RunMeshKernel(const ir::Node& node,
                                   const std::vector<const Stacked*>& inputs) {
  Kernel kernel = nullptr;
  {
    std::lock_guard<std::mutex> lock(KernelsMutex());
    auto it = KernelsByOp().find(node.op());
    SPMD_CHECK(it != KernelsByOp().end(), "internal error: no stacked kernel for ",
               node.op()->qualified);
    kernel = it->second;
  }
  return kernel(Prepare(node, inputs));
}

void RegisterStackedKernels() {
  RegisterSpmdOpKernels<Kernel>({AllGather, AllReduce, ReduceScatter, AllToAll,
                                 CollectivePermute, ShardSlice, RingSlice, RingUnroll, MaskPad,
                                 HaloExchange},
                                Register);
}

}  // namespace spmd::runtime
