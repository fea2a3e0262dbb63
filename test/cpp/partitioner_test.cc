// Propagation, resharding and the partitioner on small hand-built graphs (no torch): which
// collectives a program gets, the layouts of its outputs, and pending partial sums.
#include "partition/partitioner.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "graph_test_util.h"
#include "ir/internal_ops.h"
#include "partition/propagate.h"

namespace spmd::partition {
namespace {

using testing::F32;
using testing::MakeMesh;
using testing::Mm;
using testing::Names;
using testing::Param;
using testing::Relu;
using testing::Spec;
using testing::Tanh;
using testing::Constrain;

int Count(const Program& p, const std::string& kind) {
  int n = 0;
  for (const CollectiveStat& c : p.stats.collectives) n += c.kind == kind ? 1 : 0;
  return n;
}

std::string Dump(const Program& p) { return "\n" + p.ToText(); }

// ---------------------------------------------------------------------------------------------
// Partial sums

// x[8,16] @ w[16,32] with the contraction dim (16) tiled 4 ways over 'model': every device
// multiplies x[:, 4 cols] by w[4 rows, :], a partial [8,32] sum; the step hands back a complete
// value, so the program ends with one all-reduce.
TEST(PartitionerTest, ShardedContractionIsAllReducedOnce) {
  MeshPtr mesh = MakeMesh({4}, {"model"});
  ir::Value x = Param(F32({8, 16}), Spec(mesh, {{}, {"model"}}));
  ir::Value w = Param(F32({16, 32}), Spec(mesh, {{"model"}, {}}));
  ir::Value y = Mm(x, w);
  Program p = PartitionGraph(ir::BuildGraph({y}), 4);

  ASSERT_EQ(p.stats.collectives.size(), 1u) << Dump(p);
  const CollectiveStat& c = p.stats.collectives[0];
  EXPECT_EQ(c.kind, "all-reduce");
  EXPECT_EQ(c.axes, Names({"model"}));
  EXPECT_EQ(c.group_size, 4);
  EXPECT_EQ(c.bytes, 8 * 32 * 4);  // the local partial product, f32[8,32]
  EXPECT_EQ(c.first_group, std::vector<int64_t>({0, 1, 2, 3}));
  EXPECT_TRUE(p.stats.pending_reductions.empty());
  ASSERT_EQ(p.outputs.size(), 1u);
  EXPECT_FALSE(p.output_shardings[0].IsPartial());
  EXPECT_TRUE(p.output_shardings[0].IsReplicated());
  EXPECT_EQ(p.outputs[0].type(), F32({8, 32}));
  EXPECT_EQ(p.output_global_types[0], F32({8, 32}));
  // Parameters arrive in the layout their data has, with local shapes.
  ASSERT_EQ(p.params.size(), 2u);
  EXPECT_EQ(p.param_shardings[0], Spec(mesh, {{}, {"model"}}));
  EXPECT_EQ(p.params[0]->output(0), F32({8, 4}));
  EXPECT_EQ(p.params[1]->output(0), F32({4, 32}));
  EXPECT_TRUE(p.stats.replicated_fallback_ops.empty());
}

// The same product constrained to be tiled on its rows over the axis it is partial over: the
// reduction and the tiling are one reduce-scatter, never an all-reduce followed by a slice.
TEST(PartitionerTest, PartialSumConstrainedToTilingIsReduceScattered) {
  MeshPtr mesh = MakeMesh({4}, {"model"});
  ir::Value x = Param(F32({8, 16}), Spec(mesh, {{}, {"model"}}));
  ir::Value w = Param(F32({16, 32}), Spec(mesh, {{"model"}, {}}));
  ir::Value y = Constrain(Mm(x, w), Spec(mesh, {{"model"}, {}}));
  Program p = PartitionGraph(ir::BuildGraph({y}), 4);

  ASSERT_EQ(p.stats.collectives.size(), 1u) << Dump(p);
  const CollectiveStat& c = p.stats.collectives[0];
  EXPECT_EQ(c.kind, "reduce-scatter");
  EXPECT_EQ(c.axes, Names({"model"}));
  EXPECT_EQ(c.group_size, 4);
  EXPECT_EQ(c.bytes, 8 * 32 * 4);  // input: the whole partial f32[8,32]
  EXPECT_EQ(Count(p, "all-reduce"), 0);
  EXPECT_TRUE(p.stats.pending_reductions.empty());
  EXPECT_EQ(p.output_shardings[0], Spec(mesh, {{"model"}, {}}));
  EXPECT_EQ(p.outputs[0].type(), F32({2, 32}));  // 8 rows / 4
}

// Megatron's MLP: x replicated, w1 column-parallel, relu, w2 row-parallel. The hidden
// activation stays tiled on 'model' and the second matmul's partial sum is all-reduced once:
// no all-gather anywhere, and the 'data' axis plays no part.
TEST(PartitionerTest, MegatronMlpNeedsExactlyOneAllReduceOverModel) {
  MeshPtr mesh = MakeMesh({2, 2}, {"data", "model"});
  ir::Value x = Param(F32({8, 16}), Sharding::Replicated(mesh, 2));
  ir::Value w1 = Param(F32({16, 32}), Spec(mesh, {{}, {"model"}}));
  ir::Value w2 = Param(F32({32, 16}), Spec(mesh, {{"model"}, {}}));
  ir::Value h = Mm(x, w1);
  ir::Value a = Relu(h);
  ir::Value y = Mm(a, w2);
  ir::Graph g = ir::BuildGraph({y});
  Program p = PartitionGraph(g, 4);

  ASSERT_EQ(p.stats.collectives.size(), 1u) << Dump(p);
  const CollectiveStat& c = p.stats.collectives[0];
  EXPECT_EQ(c.kind, "all-reduce");
  EXPECT_EQ(c.axes, Names({"model"}));
  EXPECT_EQ(c.group_size, 2);
  EXPECT_EQ(c.bytes, 8 * 16 * 4);  // f32[8,16]
  // Device ids are row-major over (data, model): the first 'model' group is {0, 1}.
  EXPECT_EQ(c.first_group, std::vector<int64_t>({0, 1}));
  EXPECT_TRUE(p.stats.pending_reductions.empty());
  EXPECT_TRUE(p.output_shardings[0].IsReplicated());
  EXPECT_EQ(p.outputs[0].type(), F32({8, 16}));

  // The propagated layouts of the hidden activations: tiled on their 32 columns.
  Propagation prop(g, mesh);
  EXPECT_EQ(prop.Get(h), Spec(mesh, {{}, {"model"}}));
  EXPECT_EQ(prop.Get(a), Spec(mesh, {{}, {"model"}}));
  // The local relu runs on f32[8,16] (32 columns / 2).
  bool saw_relu = false;
  for (const ir::NodePtr& n : p.nodes) {
    if (n->op()->qualified != "aten::relu") continue;
    saw_relu = true;
    EXPECT_EQ(n->output(0), F32({8, 16}));
  }
  EXPECT_TRUE(saw_relu) << Dump(p);
}

// With defer_output_reductions the partial product leaves the step pending: no collective in
// the program, one pending all-reduce listed for whoever reads the output.
TEST(PartitionerTest, DeferredOutputReductionStaysPending) {
  MeshPtr mesh = MakeMesh({4}, {"model"});
  ir::Value x = Param(F32({8, 16}), Spec(mesh, {{}, {"model"}}));
  ir::Value w = Param(F32({16, 32}), Spec(mesh, {{"model"}, {}}));
  ir::Value y = Mm(x, w);
  PartitionOptions options;
  options.defer_output_reductions = true;
  Program p = PartitionGraph(ir::BuildGraph({y}), 4, options);

  EXPECT_TRUE(p.stats.collectives.empty()) << Dump(p);
  ASSERT_EQ(p.stats.pending_reductions.size(), 1u);
  const CollectiveStat& r = p.stats.pending_reductions[0];
  EXPECT_EQ(r.kind, "all-reduce");
  EXPECT_EQ(r.axes, Names({"model"}));
  EXPECT_EQ(r.group_size, 4);
  EXPECT_EQ(r.bytes, 8 * 32 * 4);
  EXPECT_TRUE(p.output_shardings[0].IsPartial());
  EXPECT_EQ(p.output_shardings[0].partial_axes(), AxisList({0}));
  EXPECT_EQ(p.outputs[0].type(), F32({8, 32}));
  // The flag is part of the compile-cache key.
  EXPECT_NE(options.Key(), PartitionOptions().Key());
}

// A dtype cast of x, as the recorder records `x.to(dtype)` (the rules read only the types).
ir::Value Cast(const ir::Value& x, DType dtype) {
  TensorType out{dtype, x.type().shape};
  return ir::Value{ir::MakeNode(testing::OpUnary("aten::_to_copy"), {x}, {ir::Arg::Tensor(0)}, {out}),
                   0};
}

// bf16 x[8,16] @ w[16,32] contracted over 'data' (a data-parallel weight gradient under
// autocast), then cast up to the f32 of the master weight.
ir::Value Bf16PartialCastToF32(const MeshPtr& mesh) {
  const TensorType x_type{DType::kBFloat16, {8, 16}}, w_type{DType::kBFloat16, {16, 32}};
  ir::Value x = Param(x_type, Spec(mesh, {{}, {"data"}}));
  ir::Value w = Param(w_type, Spec(mesh, {{"data"}, {}}));
  return Cast(Mm(x, w), DType::kFloat32);
}

// Deferred, the sum stays pending through the exact upcast and leaves the step in f32 (so
// gradient accumulation adds f32 partial sums and reduces once). Not deferred, it is reduced
// before the cast, in bf16: half the bytes.
TEST(PartitionerTest, DeferredSumStaysPendingThroughAnUpcast) {
  MeshPtr mesh = MakeMesh({4}, {"data"});
  PartitionOptions deferred;
  deferred.defer_output_reductions = true;
  Program p = PartitionGraph(ir::BuildGraph({Bf16PartialCastToF32(mesh)}), 4, deferred);
  EXPECT_TRUE(p.stats.collectives.empty()) << Dump(p);
  ASSERT_EQ(p.stats.pending_reductions.size(), 1u);
  EXPECT_EQ(p.stats.pending_reductions[0].bytes, 8 * 32 * 4);
  EXPECT_EQ(p.outputs[0].type(), F32({8, 32}));
  EXPECT_TRUE(p.output_shardings[0].IsPartial());

  Program q = PartitionGraph(ir::BuildGraph({Bf16PartialCastToF32(mesh)}), 4);
  ASSERT_EQ(q.stats.collectives.size(), 1u) << Dump(q);
  EXPECT_EQ(q.stats.collectives[0].kind, "all-reduce");
  EXPECT_EQ(q.stats.collectives[0].bytes, 8 * 32 * 2);
  EXPECT_TRUE(q.stats.pending_reductions.empty());
}

// Deferred too, an upcast sum that the program must reduce anyway (relu is not linear) is
// reduced before the cast, in bf16; and a narrowing cast (f32 -> bf16: the rounded terms do not
// add up to the rounded sum) never passes a pending sum.
TEST(PartitionerTest, DeferredSumIsReducedBeforeACastWhenItCannotStayPending) {
  MeshPtr mesh = MakeMesh({4}, {"data"});
  PartitionOptions deferred;
  deferred.defer_output_reductions = true;
  Program p = PartitionGraph(ir::BuildGraph({Relu(Bf16PartialCastToF32(mesh))}), 4, deferred);
  ASSERT_EQ(p.stats.collectives.size(), 1u) << Dump(p);
  EXPECT_EQ(p.stats.collectives[0].bytes, 8 * 32 * 2);
  EXPECT_TRUE(p.stats.pending_reductions.empty());

  ir::Value x = Param(F32({8, 16}), Spec(mesh, {{}, {"data"}}));
  ir::Value w = Param(F32({16, 32}), Spec(mesh, {{"data"}, {}}));
  Program q = PartitionGraph(ir::BuildGraph({Cast(Mm(x, w), DType::kBFloat16)}), 4, deferred);
  ASSERT_EQ(q.stats.collectives.size(), 1u) << Dump(q);
  EXPECT_EQ(q.stats.collectives[0].bytes, 8 * 32 * 4);
  EXPECT_TRUE(q.stats.pending_reductions.empty());
  EXPECT_EQ(q.outputs[0].type().dtype, DType::kBFloat16);
}

// A partial sum read by two consumers is reduced once (the reshard cache), and a graph output
// that is also read inside the step reuses that reduction.
TEST(PartitionerTest, PartialReadTwiceIsReducedOnce) {
  MeshPtr mesh = MakeMesh({4}, {"model"});
  ir::Value x = Param(F32({8, 16}), Spec(mesh, {{}, {"model"}}));
  ir::Value w = Param(F32({16, 32}), Spec(mesh, {{"model"}, {}}));
  ir::Value y = Mm(x, w);
  ir::Value a = Relu(y);
  ir::Value b = Tanh(y);
  Program p = PartitionGraph(ir::BuildGraph({a, b, y}), 4);
  EXPECT_EQ(p.stats.collectives.size(), 1u) << Dump(p);
  EXPECT_EQ(Count(p, "all-reduce"), 1);
  EXPECT_TRUE(p.stats.pending_reductions.empty());
  for (const Sharding& s : p.output_shardings) EXPECT_FALSE(s.IsPartial());
}

// A contraction dim of 10 over 4 devices: tiles of ceil(10/4) = 3, the last holding 1 valid
// column and 2 of padding. Both operands' padding is zeroed before the local product (a
// mask_pad each, no communication), and the partial sums are all-reduced once as before.
TEST(PartitionerTest, UnevenContractionMasksPaddingOfBothOperands) {
  MeshPtr mesh = MakeMesh({4}, {"model"});
  ir::Value x = Param(F32({8, 10}), Spec(mesh, {{}, {"model"}}));
  ir::Value w = Param(F32({10, 32}), Spec(mesh, {{"model"}, {}}));
  Program p = PartitionGraph(ir::BuildGraph({Mm(x, w)}), 4);
  ASSERT_EQ(p.stats.collectives.size(), 1u) << Dump(p);
  EXPECT_EQ(p.stats.collectives[0].kind, "all-reduce");
  EXPECT_EQ(p.params[0]->output(0), F32({8, 3}));
  EXPECT_EQ(p.params[1]->output(0), F32({3, 32}));
  int masks = 0;
  for (const ir::NodePtr& n : p.nodes) masks += n->op() == ir::InternalOps::Get().mask_pad;
  EXPECT_EQ(masks, 2) << Dump(p);
  EXPECT_EQ(p.outputs[0].type(), F32({8, 32}));
}

// An op without a sharding rule runs whole: its sharded operand is all-gathered, the op is
// counted as a replicated fallback, and its result is replicated.
TEST(PartitionerTest, OpWithoutRuleFallsBackToReplicated) {
  MeshPtr mesh = MakeMesh({4}, {"model"});
  ir::Value p0 = Param(F32({8, 16}), Spec(mesh, {{"model"}, {}}));
  ir::Value y = testing::Unary("test::opaque_op", p0);
  Program p = PartitionGraph(ir::BuildGraph({y}), 4);
  ASSERT_EQ(p.stats.collectives.size(), 1u) << Dump(p);
  EXPECT_EQ(p.stats.collectives[0].kind, "all-gather");
  ASSERT_EQ(p.stats.replicated_fallback_ops.count("test::opaque_op"), 1u);
  EXPECT_EQ(p.stats.replicated_fallback_ops.at("test::opaque_op"), 1);
  EXPECT_TRUE(p.output_shardings[0].IsReplicated());
  EXPECT_EQ(p.outputs[0].type(), F32({8, 16}));
  // One FLOP per element of the whole result, on every device: 8 * 16 = 128.
  ASSERT_EQ(p.stats.op_costs.size(), 1u);
  EXPECT_EQ(p.stats.op_costs[0].flops, 128.0);
  EXPECT_EQ(p.stats.op_costs[0].model_flops, 128.0);
}

// ---------------------------------------------------------------------------------------------
// Propagation

// A pointwise chain from a parameter tiled on its rows: every value of the chain is tiled the
// same way, and the program moves no data.
TEST(PropagationTest, PointwiseChainCarriesParameterShardingForward) {
  MeshPtr mesh = MakeMesh({4}, {"model"});
  const Sharding rows = Spec(mesh, {{"model"}, {}});
  ir::Value p0 = Param(F32({8, 16}), rows);
  ir::Value a = Relu(p0);
  ir::Value b = Tanh(a);
  ir::Value c = Relu(b);
  ir::Graph g = ir::BuildGraph({c});
  Propagation prop(g, mesh);
  EXPECT_EQ(prop.Get(p0), rows);
  EXPECT_EQ(prop.Get(a), rows);
  EXPECT_EQ(prop.Get(b), rows);
  EXPECT_EQ(prop.Get(c), rows);
  ASSERT_NE(prop.RuleOf(c.node.get()), nullptr);
  EXPECT_GE(prop.iterations(), 1);

  Program p = PartitionGraph(g, 4);
  EXPECT_TRUE(p.stats.collectives.empty()) << Dump(p);
  EXPECT_EQ(p.output_shardings[0], rows);
  EXPECT_EQ(p.outputs[0].type(), F32({2, 16}));
  for (const ir::NodePtr& n : p.nodes) EXPECT_TRUE(n->op() == ir::InternalOps::Get().device_data ||
                                                   !n->op()->internal)
      << "unexpected " << n->op()->qualified << Dump(p);
}

// A constraint at the end of a chain propagates backward to the intermediates (not to the
// replicated parameter, whose layout is fixed): each device slices its rows of the parameter
// locally, so the program still needs no collective.
TEST(PropagationTest, ConstraintPropagatesBackwardThroughPointwise) {
  MeshPtr mesh = MakeMesh({4}, {"model"});
  const Sharding rows = Spec(mesh, {{"model"}, {}});
  ir::Value p0 = Param(F32({8, 16}), Sharding::Replicated(mesh, 2));
  ir::Value a = Relu(p0);
  ir::Value b = Tanh(a);
  ir::Value c = Constrain(b, rows);
  ir::Graph g = ir::BuildGraph({c});
  Propagation prop(g, mesh);
  EXPECT_TRUE(prop.Get(p0).IsReplicated());  // device data keeps its layout
  EXPECT_EQ(prop.Get(a), rows);
  EXPECT_EQ(prop.Get(b), rows);
  EXPECT_EQ(prop.Get(c), rows);

  Program p = PartitionGraph(g, 4);
  EXPECT_TRUE(p.stats.collectives.empty()) << Dump(p);
  EXPECT_EQ(p.output_shardings[0], rows);
  EXPECT_EQ(p.outputs[0].type(), F32({2, 16}));
}

TEST(PropagationTest, IsRefinementOnlyAddsAxes) {
  MeshPtr mesh = MakeMesh({2, 2}, {"data", "model"});
  const Sharding none = Spec(mesh, {{}, {}});
  const Sharding data = Spec(mesh, {{"data"}, {}});
  const Sharding data_model = Spec(mesh, {{"data", "model"}, {}});
  const Sharding model = Spec(mesh, {{"model"}, {}});
  EXPECT_TRUE(IsRefinement(Sharding(), data));  // unknown: anything refines it
  EXPECT_TRUE(IsRefinement(none, data));
  EXPECT_TRUE(IsRefinement(data, data_model));
  EXPECT_TRUE(IsRefinement(data, data));
  EXPECT_FALSE(IsRefinement(data, model));       // replaces an axis
  EXPECT_FALSE(IsRefinement(data_model, data));  // drops an axis
  EXPECT_FALSE(IsRefinement(data, Spec(mesh, {{"data"}})));  // rank differs
}

// ---------------------------------------------------------------------------------------------
// Resharding through the partitioner

// Rows tiled over 'model' to columns tiled over 'model': one all-to-all (no gather).
TEST(ReshardTest, DimToOtherDimIsAllToAll) {
  MeshPtr mesh = MakeMesh({4}, {"model"});
  ir::Value p0 = Param(F32({8, 16}), Spec(mesh, {{"model"}, {}}));
  ir::Value c = Constrain(p0, Spec(mesh, {{}, {"model"}}));
  Program p = PartitionGraph(ir::BuildGraph({c}), 4);
  ASSERT_EQ(p.stats.collectives.size(), 1u) << Dump(p);
  EXPECT_EQ(p.stats.collectives[0].kind, "all-to-all");
  EXPECT_EQ(p.stats.collectives[0].axes, Names({"model"}));
  EXPECT_EQ(p.stats.collectives[0].group_size, 4);
  EXPECT_EQ(p.stats.collectives[0].bytes, 2 * 16 * 4);  // local f32[2,16]
  EXPECT_EQ(p.output_shardings[0], Spec(mesh, {{}, {"model"}}));
  EXPECT_EQ(p.outputs[0].type(), F32({8, 4}));
}

// Tiled to replicated: one all-gather of the local rows.
TEST(ReshardTest, TiledToReplicatedIsAllGather) {
  MeshPtr mesh = MakeMesh({4}, {"model"});
  ir::Value p0 = Param(F32({8, 16}), Spec(mesh, {{"model"}, {}}));
  ir::Value c = Constrain(p0, Sharding::Replicated(mesh, 2));
  Program p = PartitionGraph(ir::BuildGraph({c}), 4);
  ASSERT_EQ(p.stats.collectives.size(), 1u) << Dump(p);
  EXPECT_EQ(p.stats.collectives[0].kind, "all-gather");
  EXPECT_EQ(p.stats.collectives[0].axes, Names({"model"}));
  EXPECT_EQ(p.stats.collectives[0].group_size, 4);
  EXPECT_EQ(p.stats.collectives[0].bytes, 2 * 16 * 4);  // each device's input, f32[2,16]
  EXPECT_TRUE(p.output_shardings[0].IsReplicated());
  EXPECT_EQ(p.outputs[0].type(), F32({8, 16}));
}

// Replicated to tiled: a local slice, no communication.
TEST(ReshardTest, ReplicatedToTiledIsALocalSlice) {
  MeshPtr mesh = MakeMesh({4}, {"model"});
  ir::Value p0 = Param(F32({8, 16}), Sharding::Replicated(mesh, 2));
  ir::Value c = Constrain(p0, Spec(mesh, {{}, {"model"}}));
  Program p = PartitionGraph(ir::BuildGraph({c}), 4);
  EXPECT_TRUE(p.stats.collectives.empty()) << Dump(p);
  EXPECT_EQ(p.outputs[0].type(), F32({8, 4}));
  bool sliced = false;
  for (const ir::NodePtr& n : p.nodes) sliced |= n->op() == ir::InternalOps::Get().shard_slice;
  EXPECT_TRUE(sliced) << Dump(p);
}

// Rows tiled over ('data', 'model') on a 2-D mesh, wanted over 'data' only: only the dropped
// minor axis communicates, one all-gather within each 'model' group.
TEST(ReshardTest, DroppingOneOfTwoAxesGathersOverThatAxisOnly) {
  MeshPtr mesh = MakeMesh({2, 2}, {"data", "model"});
  ir::Value p0 = Param(F32({8, 16}), Spec(mesh, {{"data", "model"}, {}}));
  ir::Value c = Constrain(p0, Spec(mesh, {{"data"}, {}}));
  Program p = PartitionGraph(ir::BuildGraph({c}), 4);
  ASSERT_EQ(p.stats.collectives.size(), 1u) << Dump(p);
  EXPECT_EQ(p.stats.collectives[0].kind, "all-gather");
  EXPECT_EQ(p.stats.collectives[0].axes, Names({"model"}));
  EXPECT_EQ(p.stats.collectives[0].group_size, 2);
  EXPECT_EQ(p.stats.collectives[0].bytes, 2 * 16 * 4);  // 8 rows / 4 tiles
  EXPECT_EQ(p.outputs[0].type(), F32({4, 16}));         // 8 rows / 2
}

}  // namespace
}  // namespace spmd::partition

namespace spmd::partition {
namespace {

// The program carries what each op's rule lets the executor do (op_traits.h), one entry per
// node: the runtime reads these instead of the rules.
TEST(PartitionerTest, ProgramCarriesEachOpsTraits) {
  MeshPtr mesh = MakeMesh({4}, {"model"});
  ir::Value x = Param(F32({8, 16}), Spec(mesh, {{}, {"model"}}));
  ir::Value w = Param(F32({16, 32}), Spec(mesh, {{"model"}, {}}));
  Program p = PartitionGraph(ir::BuildGraph({Relu(Mm(x, w))}), 4);
  ASSERT_EQ(p.traits.size(), p.nodes.size());
  int mms = 0, relus = 0;
  for (size_t i = 0; i < p.nodes.size(); ++i) {
    const OpTraits& t = p.TraitsAt(i);
    const std::string& op = p.nodes[i]->op()->qualified;
    if (op == "aten::mm") {
      ++mms;
      EXPECT_FALSE(t.elementwise);
      EXPECT_TRUE(t.mergeable);
      ASSERT_EQ(t.factors.size(), 3u);  // m, n: merge along them; k: summed over, folds
      int merge = 0, fold = 0;
      for (const TraitFactor& f : t.factors) {
        merge += f.use == TraitFactor::Use::kMerge;
        fold += f.use == TraitFactor::Use::kFold;
        if (f.use == TraitFactor::Use::kFold) {
          EXPECT_EQ(f.operand_dim, std::vector<int>({1, 0}));  // x's columns, w's rows
          EXPECT_EQ(f.result_dim, std::vector<int>({-1}));     // not in the result
        }
      }
      EXPECT_EQ(merge, 2);
      EXPECT_EQ(fold, 1);
    } else if (op == "aten::relu") {
      ++relus;
      EXPECT_TRUE(t.elementwise);
    } else if (p.nodes[i]->op()->internal) {
      EXPECT_TRUE(t.factors.empty() && !t.elementwise) << op;  // collectives: no rule
    }
  }
  EXPECT_EQ(mms, 1);
  EXPECT_EQ(relus, 1);
  EXPECT_TRUE(p.TraitsAt(p.nodes.size()).factors.empty());  // out of range: nothing
}

}  // namespace
}  // namespace spmd::partition
