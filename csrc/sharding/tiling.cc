#include "sharding/tiling.h"

#include <algorithm>

#include "core/error.h"
#include "core/shape.h"

namespace spmd {

DimTiling::DimTiling(int64_t extent, int64_t count) : extent(extent), count(count) {
  SPMD_CHECK_VALUE(extent >= 0 && count >= 1, "cannot tile an extent of ", extent, " ", count,
                   " ways");
  tile_size = CeilDiv(extent, count);
}

int64_t DimTiling::Offset(int64_t index) const { return std::min(index * tile_size, extent); }

int64_t DimTiling::Length(int64_t index) const {
  return std::min((index + 1) * tile_size, extent) - Offset(index);
}

MeshGroups::MeshGroups(const Mesh& mesh, const std::vector<int>& axes)
    : groups_(DeviceGroups(mesh, axes)) {
  const int64_t max_id = *std::max_element(mesh.device_ids().begin(), mesh.device_ids().end());
  group_of_.assign(max_id + 1, -1);
  index_of_.assign(max_id + 1, -1);
  for (size_t g = 0; g < groups_.size(); ++g) {
    for (size_t i = 0; i < groups_[g].size(); ++i) {
      group_of_[groups_[g][i]] = static_cast<int64_t>(g);
      index_of_[groups_[g][i]] = static_cast<int64_t>(i);
    }
  }
}

bool MeshGroups::Contains(int64_t device) const {
  return device >= 0 && device < static_cast<int64_t>(group_of_.size()) && group_of_[device] >= 0;
}

const std::vector<int64_t>& MeshGroups::GroupOf(int64_t device) const {
  SPMD_CHECK_VALUE(Contains(device), "device ", device, " is not in the mesh");
  return groups_[group_of_[device]];
}

int64_t MeshGroups::IndexOf(int64_t device) const {
  SPMD_CHECK_VALUE(Contains(device), "device ", device, " is not in the mesh");
  return index_of_[device];
}

}  // namespace spmd
