// Host offloading's graph rewrite (partition/offload.h) and what the partitioned program makes
// of it: one copy to the host per marked value, right after it is made, one copy back before
// its first backward reader, forward readers reading it as it is, marks of parameters and
// marks without backward readers gone; the copy takes no device memory between the two.
#include "partition/offload.h"

#include <gtest/gtest.h>

#include "graph_test_util.h"
#include "partition/cost.h"
#include "partition/partitioner.h"

namespace spmd::partition {
namespace {

using testing::F32;
using testing::Mm;
using testing::Param;
using testing::Tanh;

ir::Value Mark(const ir::Value& x, bool to_host = true) {
  return ir::Value{ir::MakeNode(ir::InternalOps::Get().offload, {x},
                                {ir::Arg::Tensor(0), ir::Arg::Int(to_host ? 1 : 0)},
                                {x.type()}),
                   0};
}

ir::Value Backward(const ir::Value& v) {
  ir::Value out = v;
  out.node->set_in_backward(true);
  return out;
}

int Count(const ir::Graph& g, const ir::OpInfo* op) {
  int n = 0;
  for (const ir::NodePtr& node : g.nodes) n += node->op() == op;
  return n;
}

TEST(OffloadTest, AMarkedActivationGoesToTheHostAndBackOnce) {
  const ir::InternalOps& ops = ir::InternalOps::Get();
  ir::Value x = Param(F32({64, 64})), w = Param(F32({64, 64}));
  ir::Value h = Tanh(Mm(x, w));                 // an activation
  ir::Value saved1 = Mark(h), saved2 = Mark(h);  // saved twice (two backward ops)
  ir::Value forward = Tanh(h);                   // a forward reader
  ir::Value g1 = Backward(Tanh(saved1)), g2 = Backward(Mm(saved2, Backward(Tanh(forward))));
  ir::Value param_mark = Mark(w);                // a parameter: stays on the device
  ir::Value g3 = Backward(Mm(param_mark, g2));
  ir::Graph graph = ir::BuildGraph({g1, g3});
  ir::Graph placed = PlaceOffloaded(graph);
  EXPECT_EQ(Count(placed, ops.offload), 0);
  EXPECT_EQ(Count(placed, ops.place_to_host), 1);
  EXPECT_EQ(Count(placed, ops.place_to_device), 1);
  // The copy to the host follows the value's maker at once; the copy back precedes the first
  // backward reader, which reads it.
  int maker = -1, to_host = -1, back = -1, first_backward = -1;
  for (size_t i = 0; i < placed.nodes.size(); ++i) {
    const ir::Node& n = *placed.nodes[i];
    if (n.op() == ops.place_to_host) to_host = static_cast<int>(i);
    if (n.op() == ops.place_to_device) back = static_cast<int>(i);
    if (n.op()->qualified == "aten::tanh" && maker < 0) maker = static_cast<int>(i);
    if (n.in_backward() && first_backward < 0 && n.op() != ops.place_to_device)
      first_backward = static_cast<int>(i);
  }
  EXPECT_EQ(to_host, maker + 1);
  EXPECT_EQ(back, first_backward - 1);
  EXPECT_EQ(placed.nodes[first_backward]->input(0).node.get(), placed.nodes[back].get());
  // The forward reader reads the activation itself.
  for (const ir::NodePtr& n : placed.nodes) {
    if (!n->in_backward() && n->op()->qualified == "aten::tanh" &&
        n.get() != placed.nodes[maker].get()) {
      EXPECT_EQ(n->input(0).node.get(), placed.nodes[maker].get());
    }
  }
}

TEST(OffloadTest, MarksToSaveAndMarksWithoutBackwardReadersVanish) {
  const ir::InternalOps& ops = ir::InternalOps::Get();
  ir::Value x = Param(F32({8, 8}));
  ir::Value h = Tanh(x);
  ir::Value kept = Backward(Tanh(Mark(h, /*to_host=*/false)));
  ir::Value forward_only = Tanh(Mark(Tanh(h)));
  ir::Graph placed = PlaceOffloaded(ir::BuildGraph({kept, forward_only}));
  EXPECT_EQ(Count(placed, ops.offload), 0);
  EXPECT_EQ(Count(placed, ops.place_to_host), 0);
  EXPECT_EQ(Count(placed, ops.place_to_device), 0);
}

TEST(OffloadTest, TheHostCopyHoldsNoDeviceMemoryAndCrossesTheHostLink) {
  ir::Value x = Param(F32({256, 256})), w = Param(F32({256, 256}));
  ir::Value h = Tanh(Mm(x, w));
  ir::Value later = Tanh(Tanh(Tanh(Mm(h, w))));  // forward work after h's last forward use
  ir::Value g = Backward(Tanh(Mark(h)));
  ir::Value kept = Backward(Tanh(h));
  const int64_t bytes = 256 * 256 * 4;
  Program offloaded = PartitionGraph(ir::BuildGraph({later, g}), 1);
  Program held = PartitionGraph(ir::BuildGraph({later, kept}), 1);
  EXPECT_EQ(offloaded.stats.host_peak_bytes_per_device, bytes);
  EXPECT_EQ(held.stats.host_peak_bytes_per_device, 0);
  EXPECT_LE(offloaded.stats.peak_bytes_per_device, held.stats.peak_bytes_per_device);
  int copies = 0;
  for (const CollectiveStat& c : offloaded.stats.collectives) {
    EXPECT_EQ(c.bytes, bytes);
    EXPECT_EQ(c.channel, c.kind == "device-to-host" ? 3 : 4);
    ++copies;
  }
  EXPECT_EQ(copies, 2);
}

}  // namespace
}  // namespace spmd::partition
