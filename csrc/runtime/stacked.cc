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

namespace {

// rows.select(0, idx[u][i]) for each (u, i), as [U, k, *local]: a strided view when the
// indices are affine in (u, i) (regular meshes, values alike over some axis), else a copy.
at::Tensor RowsAt(const at::Tensor& rows, const std::vector<std::vector<int64_t>>& idx) {
  const int64_t u_count = static_cast<int64_t>(idx.size()), k = static_cast<int64_t>(idx[0].size());
  const int64_t base = idx[0][0];
  const int64_t su = u_count > 1 ? idx[1][0] - base : 0;
  const int64_t si = k > 1 ? idx[0][1] - base : 0;
  bool affine = su >= 0 && si >= 0;
  for (int64_t u = 0; affine && u < u_count; ++u)
    for (int64_t i = 0; affine && i < k; ++i) affine = idx[u][i] == base + u * su + i * si;
  std::vector<int64_t> sizes{u_count, k};
  sizes.insert(sizes.end(), rows.sizes().begin() + 1, rows.sizes().end());
  if (affine) {
    const int64_t s0 = rows.stride(0);
    std::vector<int64_t> strides{su * s0, si * s0};
    strides.insert(strides.end(), rows.strides().begin() + 1, rows.strides().end());
    return rows.as_strided(sizes, strides, rows.storage_offset() + base * s0);
  }
  std::vector<int64_t> flat;
  flat.reserve(u_count * k);
  for (const auto& row : idx) flat.insert(flat.end(), row.begin(), row.end());
  Count("StackedRowGathers");
  return rows.index_select(0, at::tensor(flat, at::kLong)).view(sizes);
}

}  // namespace

Grouped ByGroup(const std::vector<const Stacked*>& values, const MeshGroups& mesh_groups) {
  const auto& groups = mesh_groups.groups();
  const int64_t k = mesh_groups.group_size();
  const int64_t n = values.at(0)->map->num_devices();
  // A group's key: every value's rows on its members. Groups with equal keys compute alike.
  std::vector<int64_t> keys;
  keys.reserve(groups.size() * k * values.size());
  for (const auto& group : groups)
    for (const Stacked* v : values)
      for (int64_t d : group) keys.push_back(v->map->row_of[d]);
  std::vector<int64_t> representative;  // per distinct group: a group holding it
  RowMapPtr distinct = MapOfKeys(keys, k * static_cast<int64_t>(values.size()), &representative);
  const int64_t u_count = distinct->rows;
  Grouped out;
  auto group_map = std::make_shared<RowMap>();
  auto member_map = std::make_shared<RowMap>();
  group_map->row_of.assign(n, 0);
  member_map->row_of.assign(n, 0);
  group_map->rows = u_count;
  member_map->rows = u_count * k;
  for (size_t g = 0; g < groups.size(); ++g)
    for (int64_t i = 0; i < k; ++i) {
      const int32_t u = distinct->row_of[g];
      group_map->row_of[groups[g][i]] = u;
      member_map->row_of[groups[g][i]] = static_cast<int32_t>(u * k + i);
    }
  out.group_map = u_count == 1 ? ReplicatedMap(n) : group_map;
  out.member_map = member_map->rows == 1 ? ReplicatedMap(n) : member_map;
  for (const Stacked* v : values) {
    std::vector<std::vector<int64_t>> idx(u_count, std::vector<int64_t>(k));
    for (int64_t u = 0; u < u_count; ++u)
      for (int64_t i = 0; i < k; ++i) idx[u][i] = v->map->row_of[groups[representative[u]][i]];
    out.rows.push_back(RowsAt(v->rows, idx));
  }
  return out;
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

PerDevice HostBuffersOf(const Stacked& s, const std::string* label) {
  const int64_t n = s.map->num_devices();
  const int64_t bytes = s.rows.numel() / std::max<int64_t>(s.num_rows(), 1) *
                        static_cast<int64_t>(s.rows.element_size());
  std::vector<size_t> devices(n);
  for (int64_t d = 0; d < n; ++d) devices[d] = static_cast<size_t>(d);
  return MakeBuffers(s, DeviceSet::Get().AllocateOnHostsOf(devices, bytes, label), false);
}

}  // namespace spmd::runtime
