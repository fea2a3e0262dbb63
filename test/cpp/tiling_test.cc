#include "sharding/tiling.h"

#include <gtest/gtest.h>

#include <stdexcept>
#include <vector>

#include "ir/internal_attrs.h"
#include "ir/internal_ops.h"

namespace spmd {
namespace {

TEST(DimTilingTest, EvenTiles) {
  DimTiling t(12, 4);
  EXPECT_EQ(t.tile_size, 3);
  EXPECT_TRUE(t.IsEven());
  for (int64_t i = 0; i < 4; ++i) {
    EXPECT_EQ(t.Offset(i), 3 * i);
    EXPECT_EQ(t.Length(i), 3);
  }
}

TEST(DimTilingTest, UnevenTilesAreCutShortOrEmptyAtTheEnd) {
  DimTiling t(10, 4);  // tiles of 3: [0,3) [3,6) [6,9) [9,10)
  EXPECT_EQ(t.tile_size, 3);
  EXPECT_FALSE(t.IsEven());
  EXPECT_EQ(t.Offset(3), 9);
  EXPECT_EQ(t.Length(3), 1);
  DimTiling tiny(1, 4);  // tiles of 1: only tile 0 holds data
  EXPECT_EQ(tiny.Length(0), 1);
  EXPECT_EQ(tiny.Offset(2), 1);
  EXPECT_EQ(tiny.Length(2), 0);
}

TEST(DimTilingTest, RejectsBadSizes) {
  EXPECT_THROW(DimTiling(4, 0), std::invalid_argument);
  EXPECT_THROW(DimTiling(-1, 2), std::invalid_argument);
}

TEST(MeshGroupsTest, MatchesDeviceGroupsAndIndexInGroup) {
  Mesh mesh({3, 1, 7, 5, 0, 2, 6, 4}, {2, 2, 2});
  for (std::vector<int> axes : {std::vector<int>{}, {0}, {2, 0}, {1, 2}, {2, 1, 0}}) {
    MeshGroups groups(mesh, axes);
    EXPECT_EQ(groups.groups(), DeviceGroups(mesh, axes));
    EXPECT_EQ(groups.group_size(), AxesSize(mesh, axes));
    for (int64_t d : mesh.device_ids()) {
      EXPECT_EQ(groups.IndexOf(d), IndexInGroup(mesh, axes, d));
      const std::vector<int64_t>& g = groups.GroupOf(d);
      EXPECT_EQ(g.at(groups.IndexOf(d)), d);
    }
  }
}

TEST(MeshGroupsTest, DevicesOutsideTheMeshAreRejected) {
  Mesh mesh({4, 6}, {2});
  MeshGroups groups(mesh, {0});
  EXPECT_FALSE(groups.Contains(5));
  EXPECT_FALSE(groups.Contains(9));
  EXPECT_THROW(groups.IndexOf(5), std::invalid_argument);
}

// The per-device output shapes the partitioner declares for each spmd op.
TEST(SpmdOutputShapeTest, EveryOp) {
  using ir::Arg;
  const ir::InternalOps& ops = ir::InternalOps::Get();
  Mesh mesh({0, 1, 2, 3, 4, 5, 6, 7}, {4, 2});
  auto shape = [&](const ir::OpInfo* op, Shape in, std::vector<Arg> args) {
    return ir::SpmdOutputShape(*op, in, ir::SpmdAttrs::Read(*op, args), mesh);
  };
  const Arg self = Arg::Tensor(0), axes0 = Arg::IntList({0}), axes01 = Arg::IntList({0, 1});
  EXPECT_EQ(shape(ops.all_gather, {3, 5}, {self, Arg::Int(0), axes0, Arg::Int(10)}), Shape({10, 5}));
  EXPECT_EQ(shape(ops.all_reduce, {3, 5}, {self, axes01, Arg::Int(1)}), Shape({3, 5}));
  EXPECT_EQ(shape(ops.reduce_scatter, {3, 10}, {self, Arg::Int(1), axes01, Arg::Int(0), Arg::Int(10)}),
            Shape({3, 2}));
  EXPECT_EQ(shape(ops.all_to_all, {10, 2},
                  {self, Arg::Int(0), Arg::Int(1), axes0, Arg::Int(10), Arg::Int(7)}),
            Shape({3, 7}));
  EXPECT_EQ(shape(ops.collective_permute, {4}, {self, axes0, Arg::IntList({0, 1, 1, 2})}),
            Shape({4}));
  EXPECT_EQ(shape(ops.shard_slice, {9, 2}, {self, Arg::Int(0), axes0, Arg::Int(9)}), Shape({3, 2}));
  EXPECT_EQ(shape(ops.mask_pad, {3, 2}, {self, Arg::Int(0), axes0, Arg::Int(9), Arg::Double(0)}),
            Shape({3, 2}));
  EXPECT_EQ(shape(ops.halo_exchange, {2, 4},
                  {self, Arg::Int(1), axes0, Arg::Int(1), Arg::Int(2), Arg::Double(-1)}),
            Shape({2, 7}));
}

TEST(SpmdAttrsTest, ReadsAttributesByName) {
  using ir::Arg;
  const ir::OpInfo& op = *ir::InternalOps::Get().collective_permute;
  ir::SpmdAttrs a = ir::SpmdAttrs::Read(op, {Arg::Tensor(0), Arg::IntList({1, 0}),
                                             Arg::IntList({0, 1, 3, 2})});
  EXPECT_EQ(a.axes, AxisList({1, 0}));
  ASSERT_EQ(a.pairs.size(), 2u);
  EXPECT_EQ(a.pairs[1], std::make_pair(int64_t{3}, int64_t{2}));
  EXPECT_THROW(ir::SpmdAttrs::Read(op, {Arg::Tensor(0), Arg::IntList({0}), Arg::IntList({1})}),
               std::invalid_argument);
  const ir::OpInfo& ar = *ir::InternalOps::Get().all_reduce;
  EXPECT_EQ(ir::SpmdAttrs::Read(ar, {Arg::Tensor(0), Arg::IntList({0}), Arg::Int(2)}).op,
            ReduceOp::kMin);
  EXPECT_THROW(ir::SpmdAttrs::Read(ar, {Arg::Tensor(0), Arg::IntList({0}), Arg::Int(3)}),
               std::invalid_argument);
  EXPECT_THROW(ir::SpmdAttrs::Read(ar, {Arg::Tensor(0), Arg::Int(0), Arg::Int(0)}),
               std::invalid_argument);
}

}  // namespace
}  // namespace spmd
