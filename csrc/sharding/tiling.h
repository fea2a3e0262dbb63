// The index arithmetic shared by shardings and the collectives that move their tiles: how one
// dim is cut into padded tiles, and which group (and position in it) a device has for a
// collective over some mesh axes. Kept in one place so the runtime's kernels, the sharding
// geometry and the partitioner cannot disagree about where a tile starts or who holds it.
#pragma once
#include <cstdint>
#include <vector>

#include "sharding/mesh.h"

namespace spmd {

// A dim of extent `extent` cut into `count` tiles: every tile is tile_size = ceil(extent/count)
// long; tile i is valid on [0, Length(i)) and covers [Offset(i), Offset(i) + Length(i)) of the
// dim; the rest of it (trailing tiles may be entirely) padding.
struct DimTiling {
  DimTiling(int64_t extent, int64_t count);  // throws std::invalid_argument on bad sizes

  int64_t extent;
  int64_t count;
  int64_t tile_size;

  int64_t Offset(int64_t index) const;
  int64_t Length(int64_t index) const;
  bool IsEven() const { return tile_size * count == extent; }
};

// DeviceGroups(mesh, axes) with every device's group and member index looked up once, so a
// collective does O(1) work per device instead of recomputing mesh coordinates.
class MeshGroups {
 public:
  MeshGroups(const Mesh& mesh, const std::vector<int>& axes);

  const std::vector<std::vector<int64_t>>& groups() const { return groups_; }
  int64_t group_size() const { return groups_.empty() ? 0 : groups_[0].size(); }
  bool Contains(int64_t device) const;
  // The group `device` belongs to, and its position in it (its tile index over `axes`).
  const std::vector<int64_t>& GroupOf(int64_t device) const;
  int64_t IndexOf(int64_t device) const;

 private:
  std::vector<std::vector<int64_t>> groups_;
  std::vector<int64_t> group_of_;  // device id -> group, -1 if not in the mesh
  std::vector<int64_t> index_of_;  // device id -> member index
};

}  // namespace spmd
