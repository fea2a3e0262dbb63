// Factor::priority in AssignFactors: when two factors of an op want one mesh axis, the one of
// higher priority gets it, whatever the tensors' sizes; without a contest a yielding factor
// keeps its axis.
#include <gtest/gtest.h>

#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "partition/factor_assignment.h"
#include "partition/rules/rule.h"

namespace spmd::partition {
namespace {

MeshPtr Mesh8() {
  std::vector<int64_t> ids(8);
  std::iota(ids.begin(), ids.end(), 0);
  return std::make_shared<const Mesh>(ids, std::vector<int64_t>{8},
                                      std::vector<std::string>{"fsdp"});
}

// An embedding-like lookup: table [v, d], indices [b] -> [b, d], v a reduction.
ShardingRule Lookup(int table_priority) {
  ShardingRule rule;
  int v = rule.AddFactor(1024, FactorKind::kReduction);
  int d = rule.AddFactor(64);
  int b = rule.AddFactor(16);
  rule.factors[v].priority = table_priority;
  rule.operands = {{{v}, {d}}, {{b}}};
  rule.results = {{{b}, {d}}};
  return rule;
}

TEST(FactorPriorityTest, AYieldingFactorGivesAContestedAxisToTheOthers) {
  MeshPtr mesh = Mesh8();
  TensorType table{DType::kFloat32, {1024, 64}}, indices{DType::kInt64, {16}};
  TensorType out{DType::kFloat32, {16, 64}};
  Sharding rows = Sharding::Tiled(mesh, {{0}, {}}), batch = Sharding::Tiled(mesh, {{0}});
  // Equal priorities: the larger tensor (the table) keeps its layout.
  FactorAxes equal = AssignFactors(Lookup(0), *mesh, {&rows, &batch}, {table, indices},
                                   {nullptr}, {out});
  EXPECT_EQ(equal[0], (AxisList{0}));
  EXPECT_TRUE(equal[2].empty());
  // The table's rows yield: the batch keeps the axis, the table is gathered.
  FactorAxes yielded = AssignFactors(Lookup(-1), *mesh, {&rows, &batch}, {table, indices},
                                     {nullptr}, {out});
  EXPECT_TRUE(yielded[0].empty());
  EXPECT_EQ(yielded[2], (AxisList{0}));
  // Nobody else wants the axis: the table stays sharded.
  Sharding replicated = Sharding::Replicated(mesh, 1);
  FactorAxes alone = AssignFactors(Lookup(-1), *mesh, {&rows, &replicated}, {table, indices},
                                   {nullptr}, {out});
  EXPECT_EQ(alone[0], (AxisList{0}));
}

}  // namespace
}  // namespace spmd::partition
