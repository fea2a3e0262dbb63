// The spmd:: ops across processes (span_kernels.h): translation between a process's own
// devices and the global devices the mesh kernels (stacked_kernels.cc) see, the exchange of
// members' shards, and the chained sums.
#include "runtime/span_kernels.h"

#include <ATen/ATen.h>

#include <algorithm>

#include "core/error.h"
#include "ir/internal_attrs.h"
#include "ir/internal_ops.h"
#include "runtime/internal_kernels.h"
#include "runtime/tile_ops.h"

namespace spmd::runtime {

namespace {

// A value held here has rows for this process's devices only; the mesh kernels
// (RunMeshKernel) see every global device. These translate.

// Other processes' devices read this process's first device's row: no data moves, and
// a group lying in another process computes something this process then drops (when the
// value is alike there, nothing extra: keys repeat).
Stacked WithForeignDevicesAsLocal(const Stacked& x, const ProcessSpan& span) {
  auto map = std::make_shared<RowMap>();
  const int64_t first = span.first_device(), local = span.local_devices();
  map->rows = x.map->rows;
  map->row_of.resize(span.global_devices());
  for (int64_t g = 0; g < span.global_devices(); ++g) {
    const bool mine = g >= first && g < first + local;
    map->row_of[g] = x.map->row_of[mine ? g - first : 0];
  }
  return Stacked{x.rows, std::move(map), x.single, x.summed};
}

// This process's devices' rows of a value computed for every global device.
Stacked LocalRows(const Stacked& s, const ProcessSpan& span) {
  if (!s.defined()) return s;
  const int64_t first = span.first_device(), local = span.local_devices();
  std::vector<int64_t> keys(local);
  for (int64_t l = 0; l < local; ++l) keys[l] = s.map->row_of[first + l];
  std::vector<int64_t> first_device;
  RowMapPtr map = MapOfKeys(keys, 1, &first_device);
  std::vector<int64_t> source(map->rows);
  for (int64_t r = 0; r < map->rows; ++r) source[r] = keys[first_device[r]];
  at::Tensor rows = SelectRows(s.rows, source);
  at::Tensor single = map->rows == 1 ? rows.select(0, 0) : at::Tensor();
  return Stacked{rows, std::move(map), single, s.summed};
}

MeshGroups GroupsOf(const ir::Node& node) {
  SPMD_CHECK(!node.shardings().empty() && node.shardings()[0].valid(), node.op()->qualified,
             " has no output sharding to take its mesh from");
  return MeshGroups(node.shardings()[0].mesh(), ir::SpmdAttrs::Read(*node.op(), node.args()).axes);
}

std::vector<Stacked> RunOnGlobal(const ir::Node& node, const Stacked& global,
                                 const ProcessSpan& span) {
  std::vector<Stacked> out = RunMeshKernel(node, {&global});
  for (Stacked& s : out) s = LocalRows(s, span);
  return out;
}

}  // namespace

std::vector<Stacked> RunSpmdOpAcrossProcesses(const ir::Node& node,
                                              const std::vector<const Stacked*>& inputs,
                                              ProcessSpan& span) {
  SPMD_CHECK(inputs.size() == 1, node.op()->qualified, " takes one tensor, got ", inputs.size());
  if (!ExchangesAcrossProcesses(node, span))
    return RunOnGlobal(node, WithForeignDevicesAsLocal(*inputs[0], span), span);
  at::Tensor all = span.AllGather(ExchangeInput(*inputs[0]), node.op()->qualified.c_str());
  return RunWithExchanged(node, all, span);
}

bool ExchangesAcrossProcesses(const ir::Node& node, const ProcessSpan& span) {
  return span.process_count() > 1 && GroupsSpanProcesses(GroupsOf(node).groups());
}

at::Tensor ExchangeInput(const Stacked& x) {
  SPMD_CHECK(!x.summed, "internal error: a folded sum reached a collective across processes");
  std::vector<int64_t> idx(x.map->row_of.begin(), x.map->row_of.end());
  return SelectRows(x.rows, idx).contiguous();
}

std::vector<Stacked> RunWithExchanged(const ir::Node& node, const at::Tensor& all_rows,
                                      const ProcessSpan& span) {
  return RunOnGlobal(node,
                     Stacked{all_rows, IdentityMap(span.global_devices())}, span);
}

bool ChainsAcrossProcesses(const ir::Node& node, const ProcessSpan& span) {
  const ir::InternalOps& ops = ir::InternalOps::Get();
  if (node.op() != ops.all_reduce && node.op() != ops.reduce_scatter) return false;
  if (ir::SpmdAttrs::Read(*node.op(), node.args()).op != ReduceOp::kSum) return false;
  if (!ExchangesAcrossProcesses(node, span)) return false;
  const MeshGroups groups = GroupsOf(node);  // (kept: the loop reads into it)
  for (const std::vector<int64_t>& group : groups.groups()) {
    int64_t last = -1;
    std::vector<bool> seen(span.process_count(), false);
    for (int64_t d : group) {
      const int64_t p = span.ProcessOf(d);
      if (p < last) return false;
      last = p;
      seen[p] = true;
    }
    if (std::find(seen.begin(), seen.end(), false) != seen.end()) return false;
  }
  return true;
}

at::Tensor ChainPartialSums(const ir::Node& node, const Stacked& x, const at::Tensor& received,
                            const ProcessSpan& span) {
  SPMD_CHECK(!x.summed, "internal error: a folded sum reached a collective across processes");
  const MeshGroups groups = GroupsOf(node);
  const int64_t first = span.first_device(), me = span.process_index();
  std::vector<at::Tensor> sums;
  for (size_t g = 0; g < groups.groups().size(); ++g) {
    at::Tensor acc = received.defined() ? received[g].clone() : at::Tensor();
    for (int64_t d : groups.groups()[g]) {
      if (span.ProcessOf(d) != me) continue;
      const at::Tensor shard = x.Row(x.map->row_of[d - first]);
      if (!acc.defined()) acc = shard.clone(at::MemoryFormat::Preserve);  // as ReduceMembers
      else ReduceInto(acc, shard, ReduceOp::kSum);
    }
    sums.push_back(acc);
  }
  return at::stack(sums);
}

at::Tensor EmptyGroupSums(const ir::Node& node, const Stacked& x) {
  std::vector<int64_t> shape{static_cast<int64_t>(GroupsOf(node).groups().size())};
  const at::Tensor row = x.Row(0);
  shape.insert(shape.end(), row.sizes().begin(), row.sizes().end());
  return at::empty(shape, row.options());
}

std::vector<Stacked> RunWithGroupSums(const ir::Node& node, const at::Tensor& sums,
                                      const ProcessSpan& span) {
  // Every device holds its group's sum, as a folded contraction leaves it (Stacked::summed):
  // the kernels then only count (all-reduce) or split (reduce-scatter).
  const MeshGroups groups = GroupsOf(node);
  auto map = std::make_shared<RowMap>();
  map->rows = static_cast<int64_t>(groups.groups().size());
  map->row_of.assign(span.global_devices(), 0);
  for (size_t g = 0; g < groups.groups().size(); ++g)
    for (int64_t d : groups.groups()[g]) map->row_of[d] = static_cast<int32_t>(g);
  Stacked global{sums, std::move(map)};
  global.summed = true;
  return RunOnGlobal(node, global, span);
}

}  // namespace spmd::runtime
