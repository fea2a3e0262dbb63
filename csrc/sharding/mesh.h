// A logical device mesh: axis sizes, optional axis names, and the device id at every mesh
// position (row-major), as in PyTorch/XLA's Mesh(device_ids, mesh_shape, axis_names).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/hash.h"

namespace spmd {

class Mesh {
 public:
  // Throws std::invalid_argument when prod(shape) != device_ids.size(), ids repeat, an axis
  // size is < 1, or axis_names is non-empty but has the wrong length or repeated names.
  Mesh(std::vector<int64_t> device_ids, std::vector<int64_t> shape,
       std::vector<std::string> axis_names = {});

  int num_axes() const { return static_cast<int>(shape_.size()); }
  int64_t size() const { return static_cast<int64_t>(device_ids_.size()); }
  const std::vector<int64_t>& shape() const { return shape_; }
  int64_t axis_size(int axis) const { return shape_.at(axis); }
  const std::vector<int64_t>& device_ids() const { return device_ids_; }
  const std::vector<std::string>& axis_names() const { return axis_names_; }

  // Name of an axis for printing: its given name, else its index as text.
  std::string AxisLabel(int axis) const;
  // Index of a named axis, or -1.
  int AxisIndex(const std::string& name) const;
  // Whether `device` is in the mesh.
  bool Contains(int64_t device) const;
  // Mesh coordinates of a device id (throws std::invalid_argument if absent).
  std::vector<int64_t> CoordsOf(int64_t device) const;
  int64_t DeviceAt(const std::vector<int64_t>& coords) const;

  // "{'device_ids': [0, 1, ...], 'mesh_shape': (4, 2), 'axis_names': ('data', 'model')}"
  std::string ToString() const;
  Hash hash() const { return hash_; }
  bool operator==(const Mesh& other) const;
  bool operator!=(const Mesh& other) const { return !(*this == other); }

 private:
  std::vector<int64_t> device_ids_;
  std::vector<int64_t> shape_;
  std::vector<std::string> axis_names_;
  std::vector<int64_t> position_of_;  // device id -> row-major mesh position, -1 if absent
  Hash hash_ = 0;
};

using MeshPtr = std::shared_ptr<const Mesh>;

// Device groups for a collective over `axes`: each group holds the devices whose coordinates
// differ only along `axes`. Within a group, devices are ordered by their coordinates along
// `axes` (the first listed axis most major), so member i holds tile i of a dim tiled by `axes`.
// Groups are ordered row-major by the remaining coordinates. Empty `axes` gives singletons.
std::vector<std::vector<int64_t>> DeviceGroups(const Mesh& mesh, const std::vector<int>& axes);

// DeviceGroups(mesh, axes)[0], found without the others (a collective's statistics name its
// first group; on a 2048-device mesh listing every group costs more than partitioning the op).
std::vector<int64_t> FirstDeviceGroup(const Mesh& mesh, const std::vector<int>& axes);

// Position of `device` within its group of DeviceGroups(mesh, axes).
int64_t IndexInGroup(const Mesh& mesh, const std::vector<int>& axes, int64_t device);

// Product of the sizes of `axes`.
int64_t AxesSize(const Mesh& mesh, const std::vector<int>& axes);

}  // namespace spmd
