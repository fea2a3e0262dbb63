#include "sharding/mesh.h"

#include <gtest/gtest.h>

#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

namespace spmd {
namespace {

std::vector<int64_t> Iota(int64_t n) {
  std::vector<int64_t> ids(n);
  std::iota(ids.begin(), ids.end(), 0);
  return ids;
}

// Builds a mesh expecting std::invalid_argument with exactly `message`.
void ExpectMeshError(std::vector<int64_t> ids, std::vector<int64_t> shape,
                     std::vector<std::string> names, const std::string& message) {
  try {
    Mesh mesh(std::move(ids), std::move(shape), std::move(names));
    FAIL() << "expected std::invalid_argument: " << message;
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(e.what(), message);
  }
}

TEST(MeshTest, Accessors) {
  Mesh mesh(Iota(8), {4, 2}, {"data", "model"});
  EXPECT_EQ(mesh.num_axes(), 2);
  EXPECT_EQ(mesh.size(), 8);
  EXPECT_EQ(mesh.shape(), (std::vector<int64_t>{4, 2}));
  EXPECT_EQ(mesh.axis_size(0), 4);
  EXPECT_EQ(mesh.axis_size(1), 2);
  EXPECT_EQ(mesh.device_ids(), Iota(8));
  EXPECT_EQ(mesh.axis_names(), (std::vector<std::string>{"data", "model"}));
}

TEST(MeshTest, AxisLabelsAndIndices) {
  Mesh named(Iota(8), {4, 2}, {"data", "model"});
  EXPECT_EQ(named.AxisLabel(0), "data");
  EXPECT_EQ(named.AxisLabel(1), "model");
  EXPECT_EQ(named.AxisIndex("data"), 0);
  EXPECT_EQ(named.AxisIndex("model"), 1);
  EXPECT_EQ(named.AxisIndex("fsdp"), -1);

  Mesh unnamed(Iota(8), {4, 2});
  EXPECT_EQ(unnamed.AxisLabel(0), "0");
  EXPECT_EQ(unnamed.AxisLabel(1), "1");
  EXPECT_EQ(unnamed.AxisIndex("0"), -1);
}

TEST(MeshTest, CoordsAreRowMajorOverDeviceIds) {
  // Device ids laid out row-major: position p holds ids[p].
  Mesh mesh({5, 3, 7, 1, 0, 2}, {2, 3}, {"x", "y"});
  EXPECT_EQ(mesh.CoordsOf(5), (std::vector<int64_t>{0, 0}));
  EXPECT_EQ(mesh.CoordsOf(7), (std::vector<int64_t>{0, 2}));
  EXPECT_EQ(mesh.CoordsOf(1), (std::vector<int64_t>{1, 0}));
  EXPECT_EQ(mesh.CoordsOf(2), (std::vector<int64_t>{1, 2}));
  for (int64_t id : mesh.device_ids()) EXPECT_EQ(mesh.DeviceAt(mesh.CoordsOf(id)), id);
  EXPECT_EQ(mesh.DeviceAt({1, 1}), 0);
}

TEST(MeshTest, ContainsAndMissingDevices) {
  Mesh mesh({4, 6, 2, 0}, {2, 2});
  EXPECT_TRUE(mesh.Contains(0));
  EXPECT_TRUE(mesh.Contains(6));
  EXPECT_FALSE(mesh.Contains(1));
  EXPECT_FALSE(mesh.Contains(7));
  EXPECT_FALSE(mesh.Contains(-1));
  EXPECT_THROW(mesh.CoordsOf(1), std::invalid_argument);
  EXPECT_THROW(mesh.CoordsOf(100), std::invalid_argument);
  EXPECT_THROW(mesh.DeviceAt({2, 0}), std::invalid_argument);
  EXPECT_THROW(mesh.DeviceAt({0}), std::invalid_argument);
  EXPECT_THROW(mesh.DeviceAt({0, -1}), std::invalid_argument);
}

TEST(MeshTest, ValidationMessages) {
  ExpectMeshError(Iota(6), {2, 4}, {}, "Number of device IDs (6) must match mesh size (8)");
  ExpectMeshError({0, 1, 1, 2}, {2, 2}, {}, "Device IDs must be unique, got: [0, 1, 1, 2]");
  ExpectMeshError(Iota(8), {4, 2}, {"a", "b", "c"},
                  "Number of axis names (3) must match mesh dimensions (2)");
  ExpectMeshError(Iota(8), {2, 2, 2}, {"x", "y", "x"},
                  "Axis names must be unique, got: ('x', 'y', 'x')");
  ExpectMeshError({}, {2, 0}, {}, "Mesh axis sizes must be positive, got: (2, 0)");
  ExpectMeshError({-1, 0}, {2}, {}, "Device IDs must be non-negative, got: [-1, 0]");
}

TEST(MeshTest, AxisNamesAreCheckedBeforeDeviceCount) {
  // PyTorch/XLA's order: axis names, then the device count, then uniqueness.
  ExpectMeshError(Iota(3), {2, 2}, {"a", "b", "c"},
                  "Number of axis names (3) must match mesh dimensions (2)");
  ExpectMeshError({0, 0, 1}, {2, 2}, {}, "Number of device IDs (3) must match mesh size (4)");
}

TEST(MeshTest, ToStringMatchesPythonStr) {
  EXPECT_EQ(Mesh(Iota(4), {2, 2}, {"x", "y"}).ToString(),
            "{'device_ids': [0, 1, 2, 3], 'mesh_shape': (2, 2), 'axis_names': ('x', 'y')}");
  EXPECT_EQ(Mesh(Iota(8), {8}, {"data"}).ToString(),
            "{'device_ids': [0, 1, 2, 3, 4, 5, 6, 7], 'mesh_shape': (8,), "
            "'axis_names': ('data',)}");
  EXPECT_EQ(Mesh({3, 2, 1, 0}, {4}).ToString(),
            "{'device_ids': [3, 2, 1, 0], 'mesh_shape': (4,), 'axis_names': None}");
  EXPECT_EQ(Mesh(Iota(2), {2, 1}, {"it's", "b"}).ToString(),
            "{'device_ids': [0, 1], 'mesh_shape': (2, 1), 'axis_names': (\"it's\", 'b')}");
}

TEST(MeshTest, EqualityAndHash) {
  Mesh a(Iota(8), {4, 2}, {"data", "model"});
  Mesh b(Iota(8), {4, 2}, {"data", "model"});
  EXPECT_TRUE(a == b);
  EXPECT_EQ(a.hash(), b.hash());

  const Mesh others[] = {
      Mesh(Iota(8), {2, 4}, {"data", "model"}),
      Mesh(Iota(8), {4, 2}, {"model", "data"}),
      Mesh(Iota(8), {4, 2}),
      Mesh({1, 0, 2, 3, 4, 5, 6, 7}, {4, 2}, {"data", "model"}),
  };
  for (const Mesh& other : others) {
    EXPECT_TRUE(a != other) << other.ToString();
    EXPECT_NE(a.hash(), other.hash()) << other.ToString();
  }
}

TEST(MeshTest, DeviceGroupsOnTwoAxes) {
  Mesh mesh(Iota(8), {4, 2}, {"data", "model"});
  using Groups = std::vector<std::vector<int64_t>>;
  EXPECT_EQ(DeviceGroups(mesh, {1}), (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(DeviceGroups(mesh, {0}), (Groups{{0, 2, 4, 6}, {1, 3, 5, 7}}));
  EXPECT_EQ(DeviceGroups(mesh, {0, 1}), (Groups{{0, 1, 2, 3, 4, 5, 6, 7}}));
  EXPECT_EQ(DeviceGroups(mesh, {1, 0}), (Groups{{0, 2, 4, 6, 1, 3, 5, 7}}));
  EXPECT_EQ(DeviceGroups(mesh, {}), (Groups{{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}}));
}

TEST(MeshTest, DeviceGroupsOnThreeAxes) {
  Mesh mesh(Iota(8), {2, 2, 2}, {"x", "y", "z"});  // device = 4x + 2y + z
  using Groups = std::vector<std::vector<int64_t>>;
  // Groups ordered by y; members by (z, x) with z most major.
  EXPECT_EQ(DeviceGroups(mesh, {2, 0}), (Groups{{0, 4, 1, 5}, {2, 6, 3, 7}}));
  // Groups ordered by (x, z) row-major.
  EXPECT_EQ(DeviceGroups(mesh, {1}), (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
}

TEST(MeshTest, DeviceGroupsFollowDeviceIds) {
  Mesh mesh({3, 1, 0, 2}, {2, 2});
  using Groups = std::vector<std::vector<int64_t>>;
  EXPECT_EQ(DeviceGroups(mesh, {0}), (Groups{{3, 0}, {1, 2}}));
  EXPECT_EQ(DeviceGroups(mesh, {1}), (Groups{{3, 1}, {0, 2}}));
}

TEST(MeshTest, IndexInGroupAndFirstDeviceGroupMatchDeviceGroups) {
  const Mesh meshes[] = {
      Mesh(Iota(8), {8}),
      Mesh(Iota(8), {4, 2}),
      Mesh({7, 5, 3, 1, 6, 4, 2, 0}, {2, 4}),
      Mesh(Iota(12), {2, 3, 2}),
  };
  const std::vector<std::vector<int>> axis_lists = {{},     {0},    {1},       {2},   {0, 1},
                                                    {1, 0}, {2, 0}, {0, 2, 1}, {1, 2}};
  for (const Mesh& mesh : meshes) {
    for (const std::vector<int>& axes : axis_lists) {
      bool in_range = true;
      for (int axis : axes) in_range &= axis < mesh.num_axes();
      if (!in_range) continue;  // this axis list is meant for larger meshes
      const auto groups = DeviceGroups(mesh, axes);
      int64_t members = 0;
      for (const auto& group : groups) {
        ASSERT_EQ(static_cast<int64_t>(group.size()), AxesSize(mesh, axes));
        for (size_t i = 0; i < group.size(); ++i)
          EXPECT_EQ(IndexInGroup(mesh, axes, group[i]), static_cast<int64_t>(i));
        members += group.size();
      }
      EXPECT_EQ(members, mesh.size());
      EXPECT_EQ(FirstDeviceGroup(mesh, axes), groups.at(0)) << mesh.ToString();
    }
  }
}

TEST(MeshTest, AxesSize) {
  Mesh mesh(Iota(12), {2, 3, 2});
  EXPECT_EQ(AxesSize(mesh, {}), 1);
  EXPECT_EQ(AxesSize(mesh, {1}), 3);
  EXPECT_EQ(AxesSize(mesh, {2, 1}), 6);
  EXPECT_EQ(AxesSize(mesh, {0, 1, 2}), 12);
}

TEST(MeshTest, BadAxesAreRejected) {
  Mesh mesh(Iota(8), {4, 2}, {"data", "model"});
  EXPECT_THROW(AxesSize(mesh, {2}), std::invalid_argument);
  EXPECT_THROW(AxesSize(mesh, {-1}), std::invalid_argument);
  EXPECT_THROW(DeviceGroups(mesh, {0, 0}), std::invalid_argument);
  EXPECT_THROW(IndexInGroup(mesh, {1, 1}, 0), std::invalid_argument);
  EXPECT_THROW(IndexInGroup(mesh, {0}, 8), std::invalid_argument);
}

TEST(MeshTest, ZeroAxisMeshHoldsOneDevice) {
  Mesh mesh({3}, {});
  EXPECT_EQ(mesh.size(), 1);
  EXPECT_EQ(mesh.CoordsOf(3), std::vector<int64_t>{});
  EXPECT_EQ(mesh.ToString(), "{'device_ids': [3], 'mesh_shape': (), 'axis_names': None}");
  EXPECT_EQ(DeviceGroups(mesh, {}), (std::vector<std::vector<int64_t>>{{3}}));
}

}  // namespace
}  // namespace spmd
