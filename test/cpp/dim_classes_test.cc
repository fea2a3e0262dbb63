// Dim classes: which parameter dims the rules tie together (the auto-sharding search's
// variables).
#include "plan/dim_classes.h"

#include <gtest/gtest.h>

#include "graph_test_util.h"

namespace spmd::plan {
using namespace spmd::partition;  // the compiler's types the model reads
namespace {

using testing::F32;
using testing::MakeMesh;
using testing::Mm;
using testing::Param;
using testing::Relu;
using testing::Spec;

// The classes of parameter `p`'s dims.
std::vector<int> ParamDims(const ir::Graph& g, const DimClasses& c, const ir::Value& p) {
  for (size_t i = 0; i < g.params.size(); ++i)
    if (g.params[i] == p.node) return c.param_dims.at(i);
  throw std::logic_error("not a parameter of the graph");
}

// x[8,16] @ w1[16,32] -> relu -> @ w2[32,4]: the batch (x's rows), the model dim (x's columns,
// w1's rows: a contraction), the hidden dim (w1's columns, w2's rows: Megatron's column/row
// pair) and w2's columns are four classes.
TEST(DimClassesTest, TwoLayerMlpHasBatchModelHiddenAndOutputClasses) {
  MeshPtr mesh = MakeMesh({2}, {"data"});
  ir::Value x = Param(F32({8, 16}), Spec(mesh, {{}, {}}));
  ir::Value w1 = Param(F32({16, 32}), Spec(mesh, {{}, {}}));
  ir::Value w2 = Param(F32({32, 4}), Spec(mesh, {{}, {}}));
  ir::Graph g = ir::BuildGraph({Mm(Relu(Mm(x, w1)), w2)});
  DimClasses c = ComputeDimClasses(g);
  ASSERT_EQ(c.param_dims.size(), 3u);
  std::vector<int> xd = ParamDims(g, c, x), w1d = ParamDims(g, c, w1), w2d = ParamDims(g, c, w2);
  EXPECT_EQ(c.num_classes, 4);
  EXPECT_EQ(xd[1], w1d[0]);   // contraction of the first matmul
  EXPECT_EQ(w1d[1], w2d[0]);  // hidden: through relu into the second contraction
  EXPECT_NE(xd[0], xd[1]);
  EXPECT_NE(xd[0], w1d[1]);
  EXPECT_NE(w2d[1], xd[0]);
  EXPECT_NE(w2d[1], w1d[1]);
  EXPECT_NE(w1d[0], w1d[1]);
}

// A dim of size 1 has no class; a dim that no op reads keeps a class of its own.
TEST(DimClassesTest, SizeOneDimsHaveNoClass) {
  MeshPtr mesh = MakeMesh({2}, {"data"});
  ir::Value x = Param(F32({1, 16}), Spec(mesh, {{}, {}}));
  ir::Value w = Param(F32({16, 8}), Spec(mesh, {{}, {}}));
  ir::Graph g = ir::BuildGraph({Mm(x, w)});
  DimClasses c = ComputeDimClasses(g);
  EXPECT_EQ(ParamDims(g, c, x)[0], -1);
  EXPECT_EQ(ParamDims(g, c, x)[1], ParamDims(g, c, w)[0]);
  EXPECT_EQ(c.num_classes, 2);
}

}  // namespace
}  // namespace spmd::plan
