// The rule registry: one rule per name, every family registered once.
#include <gtest/gtest.h>

#include <algorithm>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "partition/rules/rule.h"

namespace spmd::partition {
namespace {

TEST(RuleRegistryTest, ANameRegisteredTwiceIsAnError) {
  RuleBuilder none = [](const ir::Node&) -> std::optional<ShardingRule> { return std::nullopt; };
  // A name of its own per run (the registry lives as long as the process: --gtest_repeat).
  static int run = 0;
  const std::string name = "test::registered_twice_" + std::to_string(run++);
  RegisterRule(name, none);
  try {
    RegisterRule(name, none);
    FAIL() << "a second registration was accepted";
  } catch (const std::logic_error& e) {
    EXPECT_NE(std::string(e.what()).find(name), std::string::npos) << e.what();
  }
}

TEST(RuleRegistryTest, EveryFamilyRegistersWithoutClashes) {
  // RegisteredRuleNames registers every family first: a name in two families (or twice in one)
  // throws here.
  std::vector<std::string> names = RegisteredRuleNames();
  EXPECT_GT(names.size(), 200u);
  EXPECT_TRUE(std::is_sorted(names.begin(), names.end()));
  EXPECT_TRUE(HasRuleFor("aten::mm"));
  EXPECT_TRUE(HasRuleFor("aten::add.Tensor"));
  EXPECT_TRUE(HasRuleFor("aten::_foreach_add.List"));
}

TEST(RuleRegistryTest, AnOpReadsExtentsUnlessItsRuleSaysOtherwise) {
  // Conservative default: a rule that does not say its kept dims are independent keeps the
  // executor from merging devices' rows into them (speed, never correctness, is at stake).
  ShardingRule plain;
  EXPECT_TRUE(plain.executor.reads_extents);
  RuleBuilder build = [](const ir::Node&) -> std::optional<ShardingRule> { return ShardingRule(); };
  const ir::OpInfo* op = ir::InternOp("test::reads_extents", {}, 1);
  ir::NodePtr node = ir::MakeNode(op, {}, {}, {TensorType{DType::kFloat32, {2}}});
  EXPECT_TRUE(build(*node)->executor.reads_extents);
  EXPECT_FALSE(ReadsNoExtents(build)(*node)->executor.reads_extents);
}

TEST(RuleRegistryTest, AnOpWithoutARuleIsTakenToReadStrides) {
  // What the executor may rely on comes from the rules; an op without one gets the
  // conservative traits: contiguous operands, no view aliasing, nothing merged.
  const ir::OpInfo* op = ir::InternOp("test::no_rule", {}, 1);
  ir::NodePtr node = ir::MakeNode(op, {}, {}, {TensorType{DType::kFloat32, {2}}});
  OpTraits traits = TraitsOf(*node);
  EXPECT_TRUE(traits.reads_strides);
  EXPECT_EQ(traits.view, ViewKind::kNone);
  EXPECT_FALSE(traits.mergeable);
  EXPECT_FALSE(ShardingRule().executor.reads_strides);  // a rule's default: ATen kernels take any strides
}

}  // namespace
}  // namespace spmd::partition
