// The xm:: cross-replica ops: attribute reading, group validation and per-replica shapes.
#include "ir/replica_ops.h"

#include <gtest/gtest.h>

#include <stdexcept>
#include <vector>

namespace spmd::ir {
namespace {

using Groups = std::vector<std::vector<int64_t>>;

std::vector<Arg> With(std::vector<Arg> head, const Groups& groups) {
  for (Arg& a : GroupArgs(groups)) head.push_back(std::move(a));
  return head;
}

Shape OutShape(const OpInfo* op, Shape in, std::vector<Arg> args) {
  return ReplicaOutputShape(*op, in, ReplicaAttrs::Read(*op, args));
}

TEST(ReplicaOpsTest, ShapesPerReplica) {
  const ReplicaOps& ops = ReplicaOps::Get();
  const Arg self = Arg::Tensor(0);
  const Groups pairs{{0, 1}, {2, 3}}, all{{3, 2, 1, 0}};
  EXPECT_EQ(OutShape(ops.all_reduce, {3, 5},
                     With({Arg::TensorList({0}), Arg::Int(0), Arg::Double(0.5)}, all)),
            Shape({3, 5}));
  EXPECT_EQ(OutShape(ops.all_gather, {3, 5}, With({self, Arg::Int(1)}, pairs)), Shape({3, 10}));
  EXPECT_EQ(OutShape(ops.reduce_scatter, {8, 5},
                     With({self, Arg::Int(1), Arg::Double(1.0), Arg::Int(0)}, all)),
            Shape({2, 5}));
  EXPECT_EQ(OutShape(ops.all_to_all, {8, 5}, With({self, Arg::Int(0), Arg::Int(1)}, all)),
            Shape({2, 20}));
  EXPECT_EQ(OutShape(ops.all_to_all, {8, 5}, With({self, Arg::Int(0), Arg::Int(0)}, pairs)),
            Shape({8, 5}));
}

TEST(ReplicaOpsTest, ReadsGroupsInMemberOrder) {
  const ReplicaOps& ops = ReplicaOps::Get();
  ReplicaAttrs a = ReplicaAttrs::Read(
      *ops.reduce_scatter,
      With({Arg::Tensor(0), Arg::Int(2), Arg::Double(0.25), Arg::Int(1)}, {{2, 0}, {1, 3}}));
  EXPECT_EQ(a.op, ReduceOp::kMin);
  EXPECT_EQ(a.scale, 0.25);
  EXPECT_EQ(a.dim, 1);
  EXPECT_EQ(a.groups, Groups({{2, 0}, {1, 3}}));
  EXPECT_EQ(a.group_size(), 2);
  EXPECT_EQ(a.world_size(), 4);
}

TEST(ReplicaOpsTest, RejectsGroupsThatAreNotAPartitionOfEqualSizes) {
  EXPECT_THROW(GroupArgs({{0, 1}, {2}}), std::invalid_argument);       // sizes differ
  EXPECT_THROW(GroupArgs({{0, 1}, {1, 2}}), std::invalid_argument);    // 1 twice, 3 missing
  EXPECT_THROW(GroupArgs({{0, 5}}), std::invalid_argument);            // out of 0..1
  EXPECT_THROW(GroupArgs({}), std::invalid_argument);
  EXPECT_NO_THROW(GroupArgs({{1}, {0}}));
}

TEST(ReplicaOpsTest, RejectsIndivisibleExtentsAndBadDims) {
  const ReplicaOps& ops = ReplicaOps::Get();
  const Arg self = Arg::Tensor(0);
  const Groups all{{0, 1, 2}};
  EXPECT_THROW(OutShape(ops.reduce_scatter, {4},
                        With({self, Arg::Int(0), Arg::Double(1.0), Arg::Int(0)}, all)),
               std::invalid_argument);
  EXPECT_THROW(OutShape(ops.all_to_all, {4, 3}, With({self, Arg::Int(0), Arg::Int(1)}, all)),
               std::invalid_argument);
  EXPECT_THROW(OutShape(ops.all_gather, {4}, With({self, Arg::Int(1)}, all)),
               std::invalid_argument);
  EXPECT_THROW(ReplicaAttrs::Read(*ops.all_gather,
                                  {self, Arg::Int(0), Arg::IntList({0, 1, 2}), Arg::Int(2)}),
               std::invalid_argument);  // 3 members do not split into groups of 2
}

}  // namespace
}  // namespace spmd::ir
