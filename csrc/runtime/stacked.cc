#include "runtime/stacked.h"

#include <ATen/ATen.h>

#include <map>
#include <mutex>
#include <unordered_map>

#include "core/error.h"
#include "core/metrics.h"
#include "runtime/device_data.h"

namespace spmd::runtime {

namespace {

RowMapPtr CachedMap(int64_t n, bool identity) {
  static std::mutex mu;
  static auto* cache = new std::map<std::pair<int64_t, bool>, RowMapPtr>();
  std::lock_guard<std::mutex> lock(mu);
  RowMapPtr& slot = (*cache)[{n, identity}];
  if (!slot) {
    auto map = std::make_shared<RowMap>();
    map->row_of.resize(n, 0);
    if (identity)
      for (int64_t d = 0; d < n; ++d) map->row_of[d] = static_cast<int32_t>(d);
    map->rows = identity ? n : 1;
    slot = std::move(map);
  }
  return slot;
}

// Whether row r of the stack is t.select(0, ...) for evenly spaced rows of one storage: then
// the stack is a strided view of that storage and nothing is copied.
at::Tensor StridedRowsView(const std::vector<at::Tensor>& rows) {
  const at::Tensor& first = rows[0];
  if (rows.size() < 2 || !first.has_storage()) return {};
  const int64_t step = rows[1].storage_offset() - first.storage_offset();
  if (step <= 0) return {};
  for (size_t r = 0; r < rows.size(); ++r) {
    const at::Tensor& t = rows[r];
    if (!t.has_storage() || !t.storage().is_alias_of(first.storage()) ||
        t.sizes() != first.sizes() || t.strides() != first.strides() ||
        t.scalar_type() != first.scalar_type() ||
        t.storage_offset() != first.storage_offset() + static_cast<int64_t>(r) * step)
      return {};
  }
  std::vector<int64_t> sizes{static_cast<int64_t>(rows.size())}, strides{step};
  sizes.insert(sizes.end(), first.sizes().begin(), first.sizes().end());
  strides.insert(strides.end(), first.strides().begin(), first.strides().end());
  return first.as_strided(sizes, strides, first.storage_offset());
}

}  // namespace

RowMapPtr ReplicatedMap(int64_t num_devices) { return CachedMap(num_devices, false); }
RowMapPtr IdentityMap(int64_t num_devices) { return CachedMap(num_devices, true); }

RowMapPtr MapOfKeys(const std::vector<int64_t>& keys, int64_t width,
                    std::vector<int64_t>* first_device) {
  SPMD_CHECK(width > 0 && keys.size() % width == 0, "internal error: bad row keys");
  const int64_t n = static_cast<int64_t>(keys.size()) / width;
  auto map = std::make_shared<RowMap>();
  map->row_of.resize(n);
  std::map<std::vector<int64_t>, int32_t> row_of_key;
  if (first_device) first_device->clear();
  for (int64_t d = 0; d < n; ++d) {
    std::vector<int64_t> key(keys.begin() + d * width, keys.begin() + (d + 1) * width);
    auto [it, added] = row_of_key.emplace(std::move(key), static_cast<int32_t>(map->rows));
    if (added) {
      ++map->rows;
      if (first_device) first_device->push_back(d);
    }
    map->row_of[d] = it->second;
  }
  if (map->rows == 1) return ReplicatedMap(n);
  return map;
}

bool SameMap(const RowMapPtr& a, const RowMapPtr& b) { return a == b || *a == *b; }

RowMapPtr GroupRowMap(const MeshGroups& groups, int64_t n) {
  auto map = std::make_shared<RowMap>();
  map->row_of.assign(n, 0);
  map->rows = static_cast<int64_t>(groups.groups().size());
  for (size_t g = 0; g < groups.groups().size(); ++g)
    for (int64_t d : groups.groups()[g]) map->row_of[d] = static_cast<int32_t>(g);
  return map->rows == 1 ? ReplicatedMap(n) : map;
}

RowMapPtr MemberRowMap(const MeshGroups& groups, int64_t n) {
  auto map = std::make_shared<RowMap>();
  map->row_of.assign(n, 0);
  const int64_t k = groups.group_size();
  map->rows = static_cast<int64_t>(groups.groups().size()) * k;
  for (size_t g = 0; g < groups.groups().size(); ++g)
    for (int64_t i = 0; i < k; ++i)
      map->row_of[groups.groups()[g][i]] = static_cast<int32_t>(g * k + i);
  if (map->rows == 1) return ReplicatedMap(n);
  if (*map == *IdentityMap(n)) return IdentityMap(n);
  return map;
}

at::Tensor RowsByGroup(const Stacked& s, const MeshGroups& mesh_groups) {
  const auto& groups = mesh_groups.groups();
  const int64_t g_count = static_cast<int64_t>(groups.size()), k = mesh_groups.group_size();
  const std::vector<int32_t>& row_of = s.map->row_of;
  const int64_t base = row_of[groups[0][0]];
  const int64_t sg = g_count > 1 ? row_of[groups[1][0]] - base : 0;
  const int64_t si = k > 1 ? row_of[groups[0][1]] - base : 0;
  bool affine = sg >= 0 && si >= 0;
  for (int64_t g = 0; affine && g < g_count; ++g)
    for (int64_t i = 0; affine && i < k; ++i) affine = row_of[groups[g][i]] == base + g * sg + i * si;
  const at::Tensor& rows = s.rows;
  std::vector<int64_t> sizes{g_count, k};
  sizes.insert(sizes.end(), rows.sizes().begin() + 1, rows.sizes().end());
  if (affine) {
    const int64_t s0 = rows.stride(0);
    std::vector<int64_t> strides{sg * s0, si * s0};
    strides.insert(strides.end(), rows.strides().begin() + 1, rows.strides().end());
    return rows.as_strided(sizes, strides, rows.storage_offset() + base * s0);
  }
  std::vector<int64_t> idx;
  idx.reserve(g_count * k);
  for (const auto& group : groups)
    for (int64_t d : group) idx.push_back(row_of[d]);
  return rows.index_select(0, at::tensor(idx, at::kLong)).view(sizes);
}

Stacked StackReplicated(const at::Tensor& tensor, int64_t num_devices) {
  return Stacked{tensor.unsqueeze(0), ReplicatedMap(num_devices), tensor};
}

Stacked StackOf(const PerDevice& buffers) {
  const int64_t n = static_cast<int64_t>(buffers.size());
  SPMD_CHECK(n > 0, "internal error: a value with no devices");
  std::vector<at::Tensor> rows;
  std::vector<int64_t> keys(n);
  std::unordered_map<const void*, int64_t> row_of_impl;
  for (int64_t d = 0; d < n; ++d) {
    SPMD_CHECK(buffers[d], "internal error: device ", d, " holds no buffer of a value");
    const at::Tensor& t = buffers[d]->tensor;
    auto [it, added] = row_of_impl.emplace(t.unsafeGetTensorImpl(), rows.size());
    if (added) rows.push_back(t);
    keys[d] = it->second;
  }
  if (rows.size() == 1) return StackReplicated(rows[0], n);
  RowMapPtr map = MapOfKeys(keys, 1);
  at::Tensor view = StridedRowsView(rows);
  if (view.defined()) return Stacked{view, std::move(map)};
  Count("StackedCopies");  // shards that came from elsewhere (the host, a per-device kernel)
  return Stacked{at::stack(rows), std::move(map)};
}

at::Tensor SelectRows(const at::Tensor& rows, const std::vector<int64_t>& idx) {
  const int64_t g = static_cast<int64_t>(idx.size());
  const int64_t step = g > 1 ? idx[1] - idx[0] : 1;
  bool spaced = step > 0;
  for (int64_t r = 1; spaced && r < g; ++r) spaced = idx[r] - idx[r - 1] == step;
  if (spaced) {
    if (idx[0] == 0 && step == 1 && g == rows.size(0)) return rows;
    return rows.slice(0, idx[0], idx[0] + (g - 1) * step + 1, step);
  }
  Count("StackedRowGathers");
  return rows.index_select(0, at::tensor(idx, at::kLong));
}

at::Tensor RowsFor(const Stacked& s, const RowMap& map, const std::vector<int64_t>& first_device) {
  std::vector<int64_t> idx(map.rows);
  for (int64_t r = 0; r < map.rows; ++r) idx[r] = s.map->row_of[first_device[r]];
  return SelectRows(s.rows, idx);
}

namespace {

// Buffers for the rows of `s`, device d holding allocs[d] (empty: charging nothing), with
// their tensors set when `views`.
PerDevice MakeBuffers(const Stacked& s, std::vector<Allocation> allocs, bool views) {
  struct Block {
    std::vector<DeviceBuffer> buffers;
    ~Block() {  // one lock for all the devices' releases
      std::vector<Allocation*> allocs;
      allocs.reserve(buffers.size());
      for (DeviceBuffer& b : buffers) allocs.push_back(&b.alloc);
      DeviceSet::ReleaseAll(allocs);
    }
  };
  const int64_t n = s.map->num_devices();
  auto block = std::make_shared<Block>();
  block->buffers.resize(n);
  PerDevice out(n);
  for (int64_t d = 0; d < n; ++d) {
    if (!allocs.empty()) block->buffers[d].alloc = std::move(allocs[d]);
    out[d] = BufferPtr(block, &block->buffers[d]);  // aliases the block's lifetime
  }
  if (views) AttachViews(s, out);
  return out;
}

}  // namespace

void AttachViews(const Stacked& s, const PerDevice& buffers) {
  std::vector<at::Tensor> rows(s.num_rows());
  for (size_t d = 0; d < buffers.size(); ++d) {
    if (buffers[d]->tensor.defined()) continue;
    at::Tensor& row = rows[s.map->row_of[d]];
    if (!row.defined()) row = s.Row(s.map->row_of[d]);
    buffers[d]->tensor = row;
  }
}

PerDevice BuffersOf(const Stacked& s, const std::string* label, PerDevice* take_from,
                    bool views) {
  const int64_t n = s.map->num_devices();
  std::vector<Allocation> allocs;
  if (take_from) {
    SPMD_CHECK(static_cast<int64_t>(take_from->size()) == n, "internal error: ",
               take_from->size(), " buffers for ", n, " devices");
    for (const BufferPtr& b : *take_from) allocs.push_back(std::move(b->alloc));
  } else {
    const int64_t bytes = s.rows.numel() / std::max<int64_t>(s.num_rows(), 1) *
                          static_cast<int64_t>(s.rows.element_size());
    std::vector<size_t> devices(n);
    for (int64_t d = 0; d < n; ++d) devices[d] = static_cast<size_t>(d);
    allocs = DeviceSet::Get().AllocateOnEach(devices, bytes, label);
  }
  return MakeBuffers(s, std::move(allocs), views);
}

PerDevice UnchargedBuffersOf(const Stacked& s) { return MakeBuffers(s, {}, false); }

}  // namespace spmd::runtime
