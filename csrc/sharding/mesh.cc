#include "sharding/mesh.h"

#include <algorithm>
#include <limits>

#include "core/str_join.h"
#include "core/error.h"

namespace spmd {
namespace {

// Python's repr of a str: single quotes unless the text holds a single quote and no double one.
std::string PyRepr(const std::string& s) {
  const bool use_double = s.find('\'') != std::string::npos && s.find('"') == std::string::npos;
  const char quote = use_double ? '"' : '\'';
  std::string out(1, quote);
  for (char c : s) {
    switch (c) {
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      case '\r': out += "\\r"; break;
      default:
        if (c == quote || c == '\\') out += '\\';
        out += c;
    }
  }
  return out + quote;
}

std::string PyRepr(int64_t v) { return std::to_string(v); }

template <typename T>
std::string JoinRepr(const std::vector<T>& items) {
  return StrJoin(items, ", ", [](std::string* out, const T& item) { *out += PyRepr(item); });
}

template <typename T>
std::string PyList(const std::vector<T>& items) {
  return "[" + JoinRepr(items) + "]";
}

// Python prints a 1-tuple with a trailing comma: (8,) and ('data',).
template <typename T>
std::string PyTuple(const std::vector<T>& items) {
  return "(" + JoinRepr(items) + (items.size() == 1 ? ",)" : ")");
}

// Saturates instead of overflowing, so an absurd shape cannot wrap around to a valid size.
int64_t SaturatingProduct(const std::vector<int64_t>& sizes) {
  int64_t product = 1;
  for (int64_t s : sizes) {
    if (__builtin_mul_overflow(product, s, &product)) return std::numeric_limits<int64_t>::max();
  }
  return product;
}

template <typename T>
bool AllUnique(std::vector<T> items) {
  std::sort(items.begin(), items.end());
  return std::adjacent_find(items.begin(), items.end()) == items.end();
}

void CheckShape(const std::vector<int64_t>& shape) {
  for (int64_t size : shape)
    SPMD_CHECK_VALUE(size >= 1, "Mesh axis sizes must be positive, got: ", PyTuple(shape));
}

void CheckAxisNames(const std::vector<std::string>& names, const std::vector<int64_t>& shape) {
  if (names.empty()) return;  // an unnamed mesh
  SPMD_CHECK_VALUE(names.size() == shape.size(), "Number of axis names (", names.size(),
                   ") must match mesh dimensions (", shape.size(), ")");
  SPMD_CHECK_VALUE(AllUnique(names), "Axis names must be unique, got: ", PyTuple(names));
}

// Same order of checks as PyTorch/XLA's Mesh: count, then uniqueness. Negative ids are rejected
// as well because ids index position_of_.
void CheckDeviceIds(const std::vector<int64_t>& ids, const std::vector<int64_t>& shape) {
  const int64_t mesh_size = SaturatingProduct(shape);
  SPMD_CHECK_VALUE(static_cast<int64_t>(ids.size()) == mesh_size, "Number of device IDs (",
                   ids.size(), ") must match mesh size (", mesh_size, ")");
  SPMD_CHECK_VALUE(AllUnique(ids), "Device IDs must be unique, got: ", PyList(ids));
  for (int64_t id : ids)
    SPMD_CHECK_VALUE(id >= 0, "Device IDs must be non-negative, got: ", PyList(ids));
}

Hash HashNames(const std::vector<std::string>& names) {
  Hash h = HashInt(static_cast<int64_t>(names.size()));
  for (const std::string& name : names) h = HashCombine(h, HashString(name));
  return h;
}

void CheckAxes(const Mesh& mesh, const std::vector<int>& axes) {
  std::vector<bool> seen(mesh.num_axes(), false);
  for (int axis : axes) {
    SPMD_CHECK_VALUE(axis >= 0 && axis < mesh.num_axes(), "Mesh axis index ", axis,
                     " is out of range for a mesh with ", mesh.num_axes(), " axes");
    SPMD_CHECK_VALUE(!seen[axis], "Each mesh axis may appear at most once, got axis ",
                     mesh.AxisLabel(axis), " twice in ",
                     PyList(std::vector<int64_t>(axes.begin(), axes.end())));
    seen[axis] = true;
  }
}

// Mixed-radix number of `coords` along `axes`, the first axis most major.
int64_t MixedRadix(const Mesh& mesh, const std::vector<int>& axes,
                   const std::vector<int64_t>& coords) {
  int64_t index = 0;
  for (int axis : axes) index = index * mesh.axis_size(axis) + coords[axis];
  return index;
}

// The mesh axes not in `axes`, ascending.
std::vector<int> OtherAxes(const Mesh& mesh, const std::vector<int>& axes) {
  std::vector<int> rest;
  for (int axis = 0; axis < mesh.num_axes(); ++axis)
    if (std::find(axes.begin(), axes.end(), axis) == axes.end()) rest.push_back(axis);
  return rest;
}

}  // namespace

Mesh::Mesh(std::vector<int64_t> device_ids, std::vector<int64_t> shape,
           std::vector<std::string> axis_names)
    : device_ids_(std::move(device_ids)),
      shape_(std::move(shape)),
      axis_names_(std::move(axis_names)) {
  CheckShape(shape_);
  CheckAxisNames(axis_names_, shape_);
  CheckDeviceIds(device_ids_, shape_);
  position_of_.assign(*std::max_element(device_ids_.begin(), device_ids_.end()) + 1, -1);
  for (size_t pos = 0; pos < device_ids_.size(); ++pos) position_of_[device_ids_[pos]] = pos;
  hash_ = HashCombine(HashCombine(HashInts(device_ids_), HashInts(shape_)), HashNames(axis_names_));
}

std::string Mesh::AxisLabel(int axis) const {
  return axis_names_.empty() ? std::to_string(axis) : axis_names_.at(axis);
}

int Mesh::AxisIndex(const std::string& name) const {
  auto it = std::find(axis_names_.begin(), axis_names_.end(), name);
  return it == axis_names_.end() ? -1 : static_cast<int>(it - axis_names_.begin());
}

bool Mesh::Contains(int64_t device) const {
  return device >= 0 && device < static_cast<int64_t>(position_of_.size()) &&
         position_of_[device] >= 0;
}

std::vector<int64_t> Mesh::CoordsOf(int64_t device) const {
  SPMD_CHECK_VALUE(Contains(device), "Device ", device, " is not in the mesh ", ToString());
  int64_t pos = position_of_[device];
  std::vector<int64_t> coords(shape_.size());
  for (int axis = num_axes() - 1; axis >= 0; --axis) {
    coords[axis] = pos % shape_[axis];
    pos /= shape_[axis];
  }
  return coords;
}

int64_t Mesh::DeviceAt(const std::vector<int64_t>& coords) const {
  SPMD_CHECK_VALUE(coords.size() == shape_.size(), "Mesh coordinates ", PyTuple(coords),
                   " do not match mesh shape ", PyTuple(shape_));
  int64_t pos = 0;
  for (int axis = 0; axis < num_axes(); ++axis) {
    SPMD_CHECK_VALUE(coords[axis] >= 0 && coords[axis] < shape_[axis], "Mesh coordinates ",
                     PyTuple(coords), " are out of range for mesh shape ", PyTuple(shape_));
    pos = pos * shape_[axis] + coords[axis];
  }
  return device_ids_[pos];
}

std::string Mesh::ToString() const {
  const std::string names = axis_names_.empty() ? "None" : PyTuple(axis_names_);
  return StrCat("{'device_ids': ", PyList(device_ids_), ", 'mesh_shape': ", PyTuple(shape_),
                ", 'axis_names': ", names, "}");
}

bool Mesh::operator==(const Mesh& other) const {
  return hash_ == other.hash_ && device_ids_ == other.device_ids_ && shape_ == other.shape_ &&
         axis_names_ == other.axis_names_;
}

std::vector<std::vector<int64_t>> DeviceGroups(const Mesh& mesh, const std::vector<int>& axes) {
  const std::vector<int> rest = OtherAxes(mesh, axes);
  std::vector<std::vector<int64_t>> groups(AxesSize(mesh, rest),
                                           std::vector<int64_t>(AxesSize(mesh, axes)));
  for (int64_t device : mesh.device_ids()) {
    const std::vector<int64_t> coords = mesh.CoordsOf(device);
    groups[MixedRadix(mesh, rest, coords)][MixedRadix(mesh, axes, coords)] = device;
  }
  return groups;
}

std::vector<int64_t> FirstDeviceGroup(const Mesh& mesh, const std::vector<int>& axes) {
  CheckAxes(mesh, axes);  // (as DeviceGroups: a repeated axis would fill a wrong group)
  std::vector<int64_t> group(AxesSize(mesh, axes));
  std::vector<int64_t> coords(mesh.num_axes(), 0);  // the other axes' coordinates stay 0
  for (int64_t i = 0; i < static_cast<int64_t>(group.size()); ++i) {
    int64_t rest = i;  // i's digits over `axes`, the last axis least significant
    for (size_t k = axes.size(); k-- > 0;) {
      coords[axes[k]] = rest % mesh.axis_size(axes[k]);
      rest /= mesh.axis_size(axes[k]);
    }
    group[i] = mesh.DeviceAt(coords);
  }
  return group;
}

int64_t IndexInGroup(const Mesh& mesh, const std::vector<int>& axes, int64_t device) {
  CheckAxes(mesh, axes);
  return MixedRadix(mesh, axes, mesh.CoordsOf(device));
}

int64_t AxesSize(const Mesh& mesh, const std::vector<int>& axes) {
  CheckAxes(mesh, axes);
  int64_t size = 1;
  for (int axis : axes) size *= mesh.axis_size(axis);
  return size;
}

}  // namespace spmd
