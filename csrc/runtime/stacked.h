// Device-batched values: the shards of all devices held as one host tensor.
//
// Every device runs the same program on equally shaped (padded) shards, so the executor keeps a
// value as `rows`, a tensor [M, *local] whose row r is the shard of every device d with
// map->row_of[d] == r. M is the number of distinct shards: 1 for a replicated value (it runs
// once), N when every device holds its own shard, in between for a value tiled over some mesh
// axes and replicated over the others. A local op then runs once over all rows (see
// batched_call.h) and a collective is a cheap operation on the rows (stacked_collectives.h), so
// emulating N devices costs about what one device running the global program costs.
//
// Each device still accounts the bytes of its own shard (DeviceSet), exactly as before: the
// stacking changes where bytes live on the host, not what a device holds.
#pragma once
#include <ATen/Tensor.h>

#include <memory>
#include <string>
#include <vector>

#include "sharding/tiling.h"


namespace spmd::runtime {

struct DeviceBuffer;  // device_data.h
using BufferPtr = std::shared_ptr<DeviceBuffer>;
using PerDevice = std::vector<BufferPtr>;  // one buffer per device

// Which row of a stacked value each device holds.
struct RowMap {
  std::vector<int32_t> row_of;  // device -> row
  int64_t rows = 0;             // 1 + the largest row (every row is some device's)

  int64_t num_devices() const { return static_cast<int64_t>(row_of.size()); }
  bool operator==(const RowMap& o) const { return rows == o.rows && row_of == o.row_of; }
};
using RowMapPtr = std::shared_ptr<const RowMap>;

// Shared maps for the two common cases (one per device count, built once).
RowMapPtr ReplicatedMap(int64_t num_devices);  // every device row 0
RowMapPtr IdentityMap(int64_t num_devices);    // device d row d
// The map whose rows are the distinct keys in order of first appearance: device d's key is
// keys[d * width, (d + 1) * width). `first_device[r]` (when given) receives the first device
// holding row r.
RowMapPtr MapOfKeys(const std::vector<int64_t>& keys, int64_t width,
                    std::vector<int64_t>* first_device = nullptr);

bool SameMap(const RowMapPtr& a, const RowMapPtr& b);

struct Stacked {
  at::Tensor rows;  // [M, *local]
  RowMapPtr map;    // map->rows == M
  at::Tensor single;  // optional, for M == 1: the one shard itself (rows is it, unsqueezed)
  // The rows already hold the sum a pending reduction (an all-reduce or reduce-scatter over
  // some group of devices) is to compute, one row per group: a contraction computed over the
  // members' stacked operands at once (Executable's folded contractions) and views of it.
  bool summed = false;

  bool defined() const { return rows.defined(); }
  int64_t num_rows() const { return map->rows; }
  bool replicated() const { return map->rows == 1; }
  at::Tensor Row(int64_t r) const { return single.defined() ? single : rows.select(0, r); }
};

// Values' rows arranged by the groups of a collective over `groups`, one entry per *distinct*
// group: groups whose members hold the same rows of every value compute the same results, so
// one of them stands for all (an all-reduce over 'data' of a value alike over 'model' is
// computed once, and its result is one row, not one per 'model' index).
struct Grouped {
  std::vector<at::Tensor> rows;  // per value: [U, k, *local]; entry (u, i) = member i's shard
  RowMapPtr group_map;           // device -> its distinct group u (U rows)
  RowMapPtr member_map;          // device -> u * k + its member index (U * k rows)
};
// The rows are strided views when regular (a mesh's groups, values alike over some axis).
Grouped ByGroup(const std::vector<const Stacked*>& values, const MeshGroups& groups);

// A replicated value: `tensor` on every one of `num_devices` devices.
Stacked StackReplicated(const at::Tensor& tensor, int64_t num_devices);

// The shards of `buffers` (one per device) as a stack: rows are the distinct host tensors in
// order of first device. When they already are equally spaced rows of one storage (what the
// executor produces) the result is a view of it; otherwise they are copied (at::stack).
Stacked StackOf(const PerDevice& buffers);

// rows.select(0, idx[r]) for each r, stacked: a view when the indices are evenly spaced (the
// identity among them), else an index_select copy.
at::Tensor SelectRows(const at::Tensor& rows, const std::vector<int64_t>& idx);

// `s` with one row per group of `map` (which must refine s.map: devices in one group of `map`
// hold one row of `s`); the rows are `s`'s (a view when they are already in that order, else
// an index_select copy).
at::Tensor RowsFor(const Stacked& s, const RowMap& map, const std::vector<int64_t>& first_device);

// Per-device buffers holding the rows of `s`, each device charging the bytes of its shard to
// its own memory (one allocation block: released together when the last buffer goes). With
// `take_from`, the devices' allocations move over from those buffers instead (a view of a
// value that dies: the bytes move with the data).
// `views` false leaves the buffers' tensors undefined until AttachViews (the executor's
// values, read stacked; only what leaves a program needs per-device tensors).
PerDevice BuffersOf(const Stacked& s, const std::string* interned_label,
                    PerDevice* take_from = nullptr, bool views = true);
// Buffers for the rows of `s` that charge nothing (a view of a value that outlives it, whose
// bytes that value's buffers already account); tensors as with views = false.
PerDevice UnchargedBuffersOf(const Stacked& s);
// Buffers for the rows of `s` charged to each device's host (DeviceSet::AllocateOnHostsOf): a
// value offloaded to host memory.
PerDevice HostBuffersOf(const Stacked& s, const std::string* interned_label);
// Sets each buffer's tensor still undefined to its row of `s`.
void AttachViews(const Stacked& s, const PerDevice& buffers);

}  // namespace spmd::runtime
