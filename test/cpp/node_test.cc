// ir::Node: nodes made from one template share their attrs (args, output types, shardings);
// giving one of them shardings copies them for that node alone, and hashes follow the attrs.
#include <gtest/gtest.h>

#include "graph_test_util.h"

namespace spmd::testing {
namespace {

TEST(NodeTest, NodesSharingAttrsReadThemAndCopyOnWrite) {
  ir::Value x = Param(F32({4, 8}));
  ir::Value y = Relu(x);  // an ordinary node: its own attrs
  auto attrs = std::make_shared<const ir::Node::Attrs>(
      ir::Node::Attrs{y.node->args(), y.node->outputs(), y.node->shardings()});
  ir::NodePtr a = ir::MakeNode(y.node->op(), {x}, attrs);
  ir::NodePtr b = ir::MakeNode(y.node->op(), {x}, attrs);
  EXPECT_EQ(&a->args(), &b->args());  // (one copy)
  EXPECT_EQ(a->output(0).shape, (Shape{4, 8}));
  EXPECT_EQ(a->num_outputs(), 1);
  EXPECT_EQ(a->hash(), y.node->hash());
  EXPECT_EQ(a->hash(), b->hash());

  MeshPtr mesh = MakeMesh({2}, {"x"});
  a->set_shardings({Spec(mesh, {{"x"}, {}})});
  ASSERT_EQ(a->shardings().size(), 1u);
  EXPECT_TRUE(b->shardings().empty());      // b still reads the shared attrs
  EXPECT_TRUE(attrs->shardings.empty());
  EXPECT_EQ(a->args().size(), b->args().size());
  EXPECT_EQ(a->output(0).shape, (Shape{4, 8}));
  EXPECT_NE(a->hash(), b->hash());          // the sharding is part of the hash
}

}  // namespace
}  // namespace spmd::testing
