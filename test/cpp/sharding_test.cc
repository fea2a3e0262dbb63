#include "sharding/sharding.h"

#include <gtest/gtest.h>

#include "graph_test_util.h"

#include <memory>
#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

namespace spmd {
namespace {

using testing::MakeMesh;
using testing::Names;
using testing::Spec;

MeshPtr DataModelMesh() { return MakeMesh({4, 2}, {"data", "model"}); }
MeshPtr XyzMesh() { return MakeMesh({2, 2, 2}, {"x", "y", "z"}); }

// ---------------------------------------------------------------------------------------------
// XLA text form

TEST(ShardingToStringTest, DataModelMeshExamples) {
  const MeshPtr mesh = DataModelMesh();
  EXPECT_EQ(Spec(mesh, {{"data"}, {"model"}}).ToString(), "{devices=[4,2]0,1,2,3,4,5,6,7}");
  EXPECT_EQ(Spec(mesh, {{"model"}, {"data"}}).ToString(), "{devices=[2,4]0,2,4,6,1,3,5,7}");
  EXPECT_EQ(Spec(mesh, {{"data", "model"}, {}}).ToString(), "{devices=[8,1]0,1,2,3,4,5,6,7}");
  EXPECT_EQ(Spec(mesh, {{"model", "data"}, {}}).ToString(), "{devices=[8,1]0,2,4,6,1,3,5,7}");
  EXPECT_EQ(Spec(mesh, {{"model"}, {}}).ToString(),
            "{devices=[2,1,4]0,2,4,6,1,3,5,7 last_tile_dim_replicate}");
  EXPECT_EQ(Spec(mesh, {{"data"}, {}}).ToString(),
            "{devices=[4,1,2]0,1,2,3,4,5,6,7 last_tile_dim_replicate}");
  EXPECT_EQ(Spec(mesh, {{}, {}}).ToString(), "{replicated}");
  EXPECT_EQ(Sharding::Replicated(mesh, 2).ToString(), "{replicated}");
}

TEST(ShardingToStringTest, TuplesOfAxesOnTheSecondDim) {
  const MeshPtr mesh = DataModelMesh();
  EXPECT_EQ(Spec(mesh, {{}, {"data", "model"}}).ToString(), "{devices=[1,8]0,1,2,3,4,5,6,7}");
  EXPECT_EQ(Spec(mesh, {{}, {"model", "data"}}).ToString(), "{devices=[1,8]0,2,4,6,1,3,5,7}");
}

TEST(ShardingToStringTest, PartialReplicationOnThreeAxisMesh) {
  const MeshPtr mesh = XyzMesh();  // device = 4x + 2y + z
  // Mesh transposed to (x, z, y); the y pairs {0,2}, {1,3}, ... replicate a tile.
  EXPECT_EQ(Spec(mesh, {{"x"}, {"z"}}).ToString(),
            "{devices=[2,2,2]0,2,1,3,4,6,5,7 last_tile_dim_replicate}");
  EXPECT_EQ(Spec(mesh, {{"y"}, {}}).ToString(),
            "{devices=[2,1,4]0,1,4,5,2,3,6,7 last_tile_dim_replicate}");
  EXPECT_EQ(Spec(mesh, {{"z"}, {}}).ToString(),
            "{devices=[2,1,4]0,2,4,6,1,3,5,7 last_tile_dim_replicate}");
  EXPECT_EQ(Spec(mesh, {{}, {"z", "x"}}).ToString(),
            "{devices=[1,4,2]0,2,4,6,1,3,5,7 last_tile_dim_replicate}");
  EXPECT_EQ(Spec(mesh, {{"z"}, {"y", "x"}}).ToString(), "{devices=[2,4]0,4,2,6,1,5,3,7}");
}

TEST(ShardingToStringTest, PartialReplicationOnTwoByFourMesh) {
  const MeshPtr mesh = MakeMesh({2, 4}, {"a", "b"});  // device = 4a + b
  EXPECT_EQ(Spec(mesh, {{"b"}, {}}).ToString(),
            "{devices=[4,1,2]0,4,1,5,2,6,3,7 last_tile_dim_replicate}");
  EXPECT_EQ(Spec(mesh, {{}, {"a"}}).ToString(),
            "{devices=[1,2,4]0,1,2,3,4,5,6,7 last_tile_dim_replicate}");
  EXPECT_EQ(Spec(mesh, {{"b"}, {"a"}}).ToString(), "{devices=[4,2]0,4,1,5,2,6,3,7}");
}

TEST(ShardingToStringTest, ReplicationGroupsAreSorted) {
  // Mesh positions hold ids 3,1 / 0,2: without sorting the groups would print as listed.
  const MeshPtr mesh = MakeMesh({2, 2}, {"x", "y"}, {3, 1, 0, 2});
  EXPECT_EQ(Spec(mesh, {{"x"}, {}}).ToString(), "{devices=[2,1,2]1,3,0,2 last_tile_dim_replicate}");
  EXPECT_EQ(Spec(mesh, {{"y"}, {}}).ToString(), "{devices=[2,1,2]0,3,1,2 last_tile_dim_replicate}");
  // Plain tiling keeps the mesh order.
  EXPECT_EQ(Spec(mesh, {{"y"}, {"x"}}).ToString(), "{devices=[2,2]3,0,1,2}");
}

TEST(ShardingToStringTest, OneDimensionalMesh) {
  const MeshPtr mesh = MakeMesh({8}, {"data"});
  EXPECT_EQ(Spec(mesh, {{"data"}}).ToString(), "{devices=[8]0,1,2,3,4,5,6,7}");
  EXPECT_EQ(Spec(mesh, {{}}).ToString(), "{replicated}");
  EXPECT_EQ(Spec(mesh, {{"data"}, {}}).ToString(), "{devices=[8,1]0,1,2,3,4,5,6,7}");
}

TEST(ShardingToStringTest, DegenerateMeshesPrintReplicated) {
  EXPECT_EQ(Spec(MakeMesh({1}, {"x"}), {{"x"}}).ToString(), "{replicated}");
  EXPECT_EQ(Sharding::Replicated(DataModelMesh(), 0).ToString(), "{replicated}");
  // A size-1 axis adds no tiles: all replicas means replicated, no replicas means plain tiled.
  EXPECT_EQ(Spec(MakeMesh({1, 8}, {"a", "b"}), {{"a"}, {}}).ToString(), "{replicated}");
  EXPECT_EQ(Spec(MakeMesh({8, 1}, {"a", "b"}), {{"a"}, {}}).ToString(),
            "{devices=[8,1]0,1,2,3,4,5,6,7}");
}

TEST(ShardingToStringTest, ManualAndPartial) {
  const MeshPtr mesh = DataModelMesh();
  EXPECT_EQ(Sharding::Manual(mesh, 2).ToString(), "{manual}");
  EXPECT_EQ(Spec(mesh, {{"data"}, {}}).WithPartial({1}, ReduceOp::kSum).ToString(),
            "{devices=[4,1,2]0,1,2,3,4,5,6,7 last_tile_dim_replicate partial=sum(model)}");
  EXPECT_EQ(Sharding::Replicated(mesh, 1).WithPartial({1, 0}, ReduceOp::kMax).ToString(),
            "{replicated partial=max(data,model)}");
}

TEST(ShardingToStringTest, NamedString) {
  const MeshPtr mesh = DataModelMesh();
  EXPECT_EQ(Spec(mesh, {{"data"}, {}}).ToNamedString(), "[{data}, {}]");
  EXPECT_EQ(Spec(mesh, {{"model", "data"}}).ToNamedString(), "[{model,data}]");
  EXPECT_EQ(Spec(mesh, {{"data"}, {}}).WithPartial({1}, ReduceOp::kSum).ToNamedString(),
            "[{data}, {}] partial=sum{model}");
  EXPECT_EQ(Sharding::Replicated(mesh, 1).WithPartial({0, 1}, ReduceOp::kMin).ToNamedString(),
            "[{}] partial=min{data,model}");
  EXPECT_EQ(Sharding::Replicated(mesh, 0).ToNamedString(), "[]");
  EXPECT_EQ(Sharding::Manual(mesh, 2).ToNamedString(), "{manual}");
  const MeshPtr unnamed = MakeMesh({4, 2}, {});
  EXPECT_EQ(Sharding::Tiled(unnamed, {{1}, {0}}).ToNamedString(), "[{1}, {0}]");
}

TEST(ShardingToStringTest, InvalidSharding) {
  EXPECT_EQ(Sharding().ToString(), "{invalid}");
  EXPECT_FALSE(Sharding().valid());
}

// ---------------------------------------------------------------------------------------------
// Construction and queries

TEST(ShardingTest, Queries) {
  const MeshPtr mesh = XyzMesh();
  const Sharding s = Spec(mesh, {{"z", "x"}, {}}).WithPartial({1}, ReduceOp::kSum);
  EXPECT_EQ(s.rank(), 2);
  EXPECT_TRUE(s.IsTiled());
  EXPECT_TRUE(s.IsPartial());
  EXPECT_FALSE(s.IsReplicated());
  EXPECT_FALSE(s.is_manual());
  EXPECT_EQ(s.axes(0), (AxisList{2, 0}));
  EXPECT_EQ(s.TiledAxes(), (AxisList{2, 0}));
  EXPECT_EQ(s.ReplicatedAxes(), AxisList{});
  EXPECT_EQ(s.partial_axes(), AxisList{1});
  EXPECT_EQ(s.partial_op(), ReduceOp::kSum);
  EXPECT_EQ(s.DimOfAxis(0), 0);
  EXPECT_EQ(s.DimOfAxis(2), 0);
  EXPECT_EQ(s.DimOfAxis(1), -1);
  EXPECT_TRUE(s.UsesAxis(1));
  EXPECT_EQ(s.NumTiles(0), 4);
  EXPECT_EQ(s.NumTiles(1), 1);

  const Sharding t = Spec(mesh, {{}, {"y"}});
  EXPECT_EQ(t.ReplicatedAxes(), (AxisList{0, 2}));
  EXPECT_FALSE(t.UsesAxis(0));
  EXPECT_EQ(t.DimOfAxis(1), 1);
}

TEST(ShardingTest, ReplicatedAndManualKinds) {
  const MeshPtr mesh = DataModelMesh();
  const Sharding r = Sharding::Replicated(mesh, 3);
  EXPECT_TRUE(r.IsReplicated());
  EXPECT_FALSE(r.IsTiled());
  EXPECT_EQ(r.rank(), 3);
  EXPECT_EQ(r.ReplicatedAxes(), (AxisList{0, 1}));
  EXPECT_FALSE(r.WithPartial({0}, ReduceOp::kSum).IsReplicated());

  const Sharding m = Sharding::Manual(mesh, 2);
  EXPECT_TRUE(m.is_manual());
  EXPECT_FALSE(m.IsReplicated());
  EXPECT_EQ(m.rank(), 2);

  // Tiling over a size-1 axis splits nothing.
  const Sharding one = Spec(MakeMesh({1, 8}, {"a", "b"}), {{"a"}});
  EXPECT_FALSE(one.IsTiled());
  EXPECT_TRUE(one.IsReplicated());
}

TEST(ShardingTest, AxisMisuseIsRejected) {
  const MeshPtr mesh = DataModelMesh();
  EXPECT_THROW(Sharding::Tiled(mesh, {{2}}), std::invalid_argument);
  EXPECT_THROW(Sharding::Tiled(mesh, {{-1}}), std::invalid_argument);
  EXPECT_THROW(Sharding::Tiled(mesh, {{0}, {0}}), std::invalid_argument);
  EXPECT_THROW(Sharding::Tiled(mesh, {{0, 1, 0}}), std::invalid_argument);
  EXPECT_THROW(Sharding::Tiled(nullptr, {{0}}), std::invalid_argument);
  EXPECT_THROW(Sharding::Replicated(mesh, -1), std::invalid_argument);

  const Sharding s = Spec(mesh, {{"data"}, {}});
  EXPECT_THROW(s.WithPartial({0}, ReduceOp::kSum), std::invalid_argument);
  EXPECT_THROW(s.WithDimAxes(1, {0}), std::invalid_argument);
  EXPECT_THROW(s.WithPartial({1}, ReduceOp::kSum).WithDimAxes(1, {1}), std::invalid_argument);
}

TEST(ShardingTest, CopiesWithOneChange) {
  const MeshPtr mesh = DataModelMesh();
  const Sharding s = Spec(mesh, {{"data"}, {}});
  EXPECT_EQ(s.WithDimAxes(1, {1}), Spec(mesh, {{"data"}, {"model"}}));
  EXPECT_EQ(s.WithDimAxes(0, {}), Sharding::Replicated(mesh, 2));

  const Sharding p = Sharding::Replicated(mesh, 1).WithPartial({1, 0}, ReduceOp::kMax);
  EXPECT_EQ(p.partial_axes(), (AxisList{0, 1}));  // kept ascending
  EXPECT_EQ(p.partial_op(), ReduceOp::kMax);
  EXPECT_EQ(p.WithoutPartial(), Sharding::Replicated(mesh, 1));
  EXPECT_EQ(p.WithoutPartial().hash(), Sharding::Replicated(mesh, 1).hash());
  EXPECT_EQ(p.WithPartial({}, ReduceOp::kMin), Sharding::Replicated(mesh, 1));
}

TEST(ShardingTest, EqualityAndHash) {
  // Equal meshes held by different pointers give equal shardings.
  const Sharding a = Spec(DataModelMesh(), {{"data"}, {"model"}});
  const Sharding b = Spec(DataModelMesh(), {{"data"}, {"model"}});
  EXPECT_EQ(a, b);
  EXPECT_EQ(a.hash(), b.hash());

  const MeshPtr mesh = DataModelMesh();
  const Sharding others[] = {
      Spec(mesh, {{"model"}, {"data"}}),
      Spec(mesh, {{"data", "model"}, {}}),
      Spec(mesh, {{"model", "data"}, {}}),
      Spec(mesh, {{"data"}, {}}),
      Spec(mesh, {{"data"}, {}}).WithPartial({1}, ReduceOp::kSum),
      Spec(mesh, {{"data"}, {}}).WithPartial({1}, ReduceOp::kMax),
      Sharding::Replicated(mesh, 2),
      Sharding::Manual(mesh, 2),
      Sharding::Replicated(mesh, 3),
      Spec(MakeMesh({4, 2}, {"data", "model"}, {7, 6, 5, 4, 3, 2, 1, 0}), {{"data"}, {"model"}}),
      Sharding(),
  };
  for (const Sharding& other : others) {
    EXPECT_NE(a, other) << other.ToNamedString();
    EXPECT_NE(a.hash(), other.hash()) << other.ToNamedString();
  }
  EXPECT_EQ(Sharding(), Sharding());
}

// ---------------------------------------------------------------------------------------------
// Geometry

TEST(ShardingGeometryTest, UnevenDimIsPadded) {
  const MeshPtr mesh = MakeMesh({4}, {"x"});
  const Sharding s = Spec(mesh, {{"x"}});
  EXPECT_EQ(s.ShardShape({10}), Shape{3});
  EXPECT_FALSE(s.IsEven({10}));
  const int64_t offsets[] = {0, 3, 6, 9};
  const int64_t lengths[] = {3, 3, 3, 1};
  for (int64_t device = 0; device < 4; ++device) {
    EXPECT_EQ(s.ShardOffset({10}, 0, device), offsets[device]);
    EXPECT_EQ(s.ShardLength({10}, 0, device), lengths[device]);
  }
}

TEST(ShardingGeometryTest, MoreTilesThanElementsGivesEmptyTiles) {
  const Sharding s = Spec(MakeMesh({4}, {"x"}), {{"x"}});
  EXPECT_EQ(s.ShardShape({2}), Shape{1});
  const int64_t offsets[] = {0, 1, 2, 2};
  const int64_t lengths[] = {1, 1, 0, 0};
  for (int64_t device = 0; device < 4; ++device) {
    EXPECT_EQ(s.ShardOffset({2}, 0, device), offsets[device]);
    EXPECT_EQ(s.ShardLength({2}, 0, device), lengths[device]);
  }
}

TEST(ShardingGeometryTest, TupleOfAxesAndReplicatedDim) {
  const MeshPtr mesh = DataModelMesh();  // device = 2 * data + model
  const Sharding s = Spec(mesh, {{"model", "data"}, {}});
  EXPECT_EQ(s.ShardShape({16, 5}), (Shape{2, 5}));
  EXPECT_TRUE(s.IsEven({16, 5}));
  for (int64_t device = 0; device < 8; ++device) {
    const int64_t tile = (device % 2) * 4 + device / 2;  // model most major
    EXPECT_EQ(s.TileIndex(0, device), tile);
    EXPECT_EQ(s.ShardOffset({16, 5}, 0, device), 2 * tile);
    EXPECT_EQ(s.ShardLength({16, 5}, 0, device), 2);
    EXPECT_EQ(s.TileIndex(1, device), 0);
    EXPECT_EQ(s.ShardOffset({16, 5}, 1, device), 0);
    EXPECT_EQ(s.ShardLength({16, 5}, 1, device), 5);
  }
}

TEST(ShardingGeometryTest, RankMismatchAndUnknownDevice) {
  const Sharding s = Spec(DataModelMesh(), {{"data"}, {}});
  EXPECT_THROW(s.ShardShape({8}), std::invalid_argument);
  EXPECT_THROW(s.TileIndex(0, 8), std::invalid_argument);
  EXPECT_EQ(s.ShardShape({0, 3}), (Shape{0, 3}));
  EXPECT_TRUE(s.IsEven({0, 3}));
}

// ---------------------------------------------------------------------------------------------
// Consistency of TileIndex with DeviceGroups and with the printed tile assignment

struct Case {
  MeshPtr mesh;
  std::vector<AxisList> dim_axes;
};

std::vector<Case> ConsistencyCases() {
  const MeshPtr m8 = MakeMesh({8}, {"d"});
  const MeshPtr m42 = DataModelMesh();
  const MeshPtr m222 = XyzMesh();
  const MeshPtr m24 = MakeMesh({2, 4}, {"a", "b"}, {5, 0, 7, 2, 1, 6, 3, 4});
  const MeshPtr m232 = MakeMesh({2, 3, 2}, {"p", "q", "r"});
  return {
      {m8, {{0}}},          {m8, {{}, {0}}},       {m42, {{0}, {1}}},  {m42, {{1}, {0}}},
      {m42, {{1, 0}, {}}},  {m42, {{}, {1}}},      {m222, {{0}, {2}}}, {m222, {{2, 0}, {1}}},
      {m222, {{}, {1, 2}}}, {m24, {{1}, {}}},      {m24, {{0, 1}}},    {m24, {{}, {1}, {0}}},
      {m232, {{1}, {2}}},   {m232, {{2, 1}, {0}}}, {m232, {{}, {1}}},
  };
}

TEST(ShardingConsistencyTest, TileIndexMatchesDeviceGroups) {
  for (const Case& c : ConsistencyCases()) {
    const Sharding s = Sharding::Tiled(c.mesh, c.dim_axes);
    for (int64_t d = 0; d < s.rank(); ++d) {
      for (const std::vector<int64_t>& group : DeviceGroups(*c.mesh, s.axes(d))) {
        ASSERT_EQ(static_cast<int64_t>(group.size()), s.NumTiles(d));
        for (size_t i = 0; i < group.size(); ++i)
          EXPECT_EQ(s.TileIndex(d, group[i]), static_cast<int64_t>(i))
              << s.ToNamedString() << " dim " << d << " device " << group[i];
      }
    }
  }
}

TEST(ShardingConsistencyTest, TileAssignmentPlacesEachDeviceAtItsTile) {
  for (const Case& c : ConsistencyCases()) {
    const Sharding s = Sharding::Tiled(c.mesh, c.dim_axes);
    const TileAssignment ta = ToTileAssignment(s);
    ASSERT_FALSE(ta.replicated) << s.ToNamedString();
    ASSERT_EQ(ta.NumTensorDims(), s.rank());
    ASSERT_EQ(static_cast<int64_t>(ta.devices.size()), c.mesh->size());
    // Walk the device list row-major, recovering each device's array coordinates.
    for (size_t pos = 0; pos < ta.devices.size(); ++pos) {
      int64_t rest = static_cast<int64_t>(pos);
      for (int64_t d = static_cast<int64_t>(ta.dims.size()) - 1; d >= 0; --d) {
        const int64_t coord = rest % ta.dims[d];
        rest /= ta.dims[d];
        if (d == s.rank()) continue;  // the replication dim
        EXPECT_EQ(s.TileIndex(d, ta.devices[pos]), coord)
            << s.ToString() << " dim " << d << " device " << ta.devices[pos];
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Parsing

TEST(TileAssignmentTest, ParseFields) {
  const TileAssignment ta =
      TileAssignment::Parse("{devices=[2,1,4]0,2,4,6,1,3,5,7 last_tile_dim_replicate}");
  EXPECT_FALSE(ta.replicated);
  EXPECT_FALSE(ta.manual);
  EXPECT_EQ(ta.dims, (std::vector<int64_t>{2, 1, 4}));
  EXPECT_EQ(ta.devices, (std::vector<int64_t>{0, 2, 4, 6, 1, 3, 5, 7}));
  EXPECT_TRUE(ta.last_tile_dim_replicate);
  EXPECT_EQ(ta.NumTensorDims(), 2);

  const TileAssignment tiled = TileAssignment::Parse("{devices=[8]7,6,5,4,3,2,1,0}");
  EXPECT_EQ(tiled.dims, std::vector<int64_t>{8});
  EXPECT_EQ(tiled.devices, (std::vector<int64_t>{7, 6, 5, 4, 3, 2, 1, 0}));
  EXPECT_FALSE(tiled.last_tile_dim_replicate);
  EXPECT_EQ(tiled.NumTensorDims(), 1);

  EXPECT_TRUE(TileAssignment::Parse("{replicated}").replicated);
  EXPECT_TRUE(TileAssignment::Parse("{manual}").manual);
}

TEST(TileAssignmentTest, ToStringInvertsParse) {
  const std::string texts[] = {
      "{replicated}",
      "{manual}",
      "{devices=[4,2]0,1,2,3,4,5,6,7}",
      "{devices=[2,4]0,2,4,6,1,3,5,7}",
      "{devices=[8,1]0,2,4,6,1,3,5,7}",
      "{devices=[2,1,4]0,2,4,6,1,3,5,7 last_tile_dim_replicate}",
      "{devices=[4,1,2]0,1,2,3,4,5,6,7 last_tile_dim_replicate}",
      "{devices=[2,2,2]0,2,1,3,4,6,5,7 last_tile_dim_replicate}",
      "{devices=[1]0}",
      "{devices=[2]10,11}",
  };
  for (const std::string& text : texts) EXPECT_EQ(TileAssignment::Parse(text).ToString(), text);
}

TEST(TileAssignmentTest, PrintedShardingsRoundTrip) {
  for (const Case& c : ConsistencyCases()) {
    const TileAssignment ta = ToTileAssignment(Sharding::Tiled(c.mesh, c.dim_axes));
    const TileAssignment parsed = TileAssignment::Parse(ta.ToString());
    EXPECT_EQ(parsed.dims, ta.dims);
    EXPECT_EQ(parsed.devices, ta.devices);
    EXPECT_EQ(parsed.last_tile_dim_replicate, ta.last_tile_dim_replicate);
    EXPECT_EQ(parsed.ToString(), ta.ToString());
  }
}

TEST(TileAssignmentTest, MalformedTextIsRejected) {
  const std::string texts[] = {
      "",
      "replicated",
      "{replicated",
      "{Replicated}",
      " {replicated}",
      "{replicated} ",
      "devices=[2]0,1",
      "{devices=[2]0,1",
      "{devices=[2,2]0,1,2}",
      "{devices=[2]0,1,2}",
      "{devices=[]}",
      "{devices=[2]}",
      "{devices=[2]0,a}",
      "{devices=[2]0,,1}",
      "{devices=[2]0,1,}",
      "{devices=[2]-1,0}",
      "{devices=[2] 0,1}",
      "{devices=[2]0,1 foo}",
      "{devices=[2]0,1 last_tile_dim_replicate foo}",
      "{devices=[2]0,1}}",
      "{devices=[0]}",
      "{devices=[2,0]0,1}",
      "{devices=[2]0,0}",
      "{devices=[2]0,1000000000000000000000}",
      "{maximal device=3}",
      "{devices=[1,8]<=[8]}",
  };
  for (const std::string& text : texts) {
    try {
      TileAssignment::Parse(text);
      ADD_FAILURE() << "parsed: " << text;
    } catch (const std::invalid_argument& e) {
      EXPECT_EQ(e.what(), "sharding " + text + " is not organized as expected");
    }
  }
}

TEST(ReduceOpTest, Names) {
  EXPECT_EQ(ReduceOpName(ReduceOp::kSum), "sum");
  EXPECT_EQ(ReduceOpName(ReduceOp::kMax), "max");
  EXPECT_EQ(ReduceOpName(ReduceOp::kMin), "min");
}

}  // namespace
}  // namespace spmd
