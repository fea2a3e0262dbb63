// The collective model (plan/collective_model.h) by topology: GPU hosts on NVLink with a
// NIC per GPU, TPU slices on an ICI torus joined by DCN, and the latency of small collectives
// on large groups, against numbers worked out by hand.
#include "plan/collective_model.h"

#include <gtest/gtest.h>

#include <numeric>
#include <string>
#include <vector>

#include "graph_test_util.h"

namespace spmd::plan {
using namespace spmd::partition;  // the compiler's types the model reads
namespace {

using testing::Close;
using testing::Stat;

std::vector<int64_t> Ids(int64_t first, int64_t count, int64_t stride = 1) {
  std::vector<int64_t> ids(count);
  for (int64_t i = 0; i < count; ++i) ids[i] = first + i * stride;
  return ids;
}

// H100-like hosts: 8 GPUs on NVLink (450e9 B/s a direction), a 50e9 B/s NIC each, 3 us a step.
Hardware GpuCluster() {
  Hardware hw;
  hw.ring_bandwidth = 450e9;
  hw.cross_domain_bandwidth = 50e9;
  hw.devices_per_domain = 8;
  hw.link_latency = 3e-6;
  return hw;
}

// v5p-like slices: a 3-D ICI torus (200e9 B/s along a ring), 6.25e9 B/s of DCN per chip, 5 us.
Hardware TpuSlices(int64_t chips_per_slice) {
  Hardware hw;
  hw.ring_bandwidth = 200e9;
  hw.cross_domain_bandwidth = 6.25e9;
  hw.devices_per_domain = chips_per_slice;
  hw.torus_dims = 3;
  hw.link_latency = 5e-6;
  return hw;
}

TEST(PlaceGroupTest, DomainsAndTheFewestMembersInOne) {
  GroupPlacement p = PlaceGroup({6, 7, 8, 9}, 4, 8);
  EXPECT_EQ(p.domains, 2);
  EXPECT_EQ(p.per_domain, 2);
  p = PlaceGroup({0, 1, 2, 8}, 4, 8);  // three on host 0, one on host 1
  EXPECT_EQ(p.domains, 2);
  EXPECT_EQ(p.per_domain, 1);
  p = PlaceGroup(Ids(0, 16), 16, 0);  // one domain for everything
  EXPECT_EQ(p.domains, 1);
  EXPECT_EQ(p.per_domain, 16);
  p = PlaceGroup({}, 4, 8);  // group unknown: one domain
  EXPECT_EQ(p.domains, 1);
}

TEST(RingStepsTest, ARingPerTorusDimension) {
  EXPECT_EQ(RingSteps(8, 0), 7.0);      // a switch: one ring, n-1 steps
  EXPECT_EQ(RingSteps(256, 2), 30.0);   // 16 x 16: 15 + 15
  EXPECT_EQ(RingSteps(4096, 3), 45.0);  // 16 x 16 x 16: 3 x 15
  EXPECT_EQ(RingSteps(8192, 3), 61.0);  // 32 x 16 x 16
  EXPECT_EQ(RingSteps(8, 3), 3.0);      // 2 x 2 x 2
  EXPECT_EQ(RingSteps(6, 2), 3.0);      // 3 x 2
  EXPECT_EQ(RingSteps(2, 3), 1.0);      // 2 x 1 x 1
  EXPECT_EQ(RingSteps(7, 2), 6.0);      // prime: one ring
  EXPECT_EQ(RingSteps(1, 3), 0.0);
}

TEST(SpanOnTorusTest, WhereAMeshAxisSitsOnTheSlice) {
  // A v5e-256 slice is 16 x 16, ids along the first side fastest. Mesh (fsdp 16, tensor 16):
  // a tensor group is one whole dimension (a ring: 15 steps, one dimension's bandwidth), an
  // fsdp group (stride 16) the other.
  TorusSpan tp = SpanOnTorus(Ids(0, 16), 256, 2);
  EXPECT_EQ(tp.steps, 15);
  EXPECT_EQ(tp.bandwidth_factor, 1);
  TorusSpan fsdp = SpanOnTorus(Ids(3, 16, 16), 256, 2);
  EXPECT_EQ(fsdp.steps, 15);
  EXPECT_EQ(fsdp.bandwidth_factor, 1);
  // All 256 chips: both dimensions' links at once.
  TorusSpan all = SpanOnTorus(Ids(0, 256), 256, 2);
  EXPECT_EQ(all.steps, 30);
  EXPECT_EQ(all.bandwidth_factor, 2);
  // Four neighbours of a 16-chip dimension: a line, no wraparound link, half the bandwidth.
  TorusSpan line = SpanOnTorus(Ids(4, 4), 256, 2);
  EXPECT_EQ(line.steps, 3);
  EXPECT_EQ(line.bandwidth_factor, 0.5);
  // 512 v5p chips are 8 x 8 x 8; mesh (fsdp 64, tensor 8): tensor one dimension, fsdp two.
  EXPECT_EQ(SpanOnTorus(Ids(0, 8), 512, 3).bandwidth_factor, 1);
  TorusSpan f = SpanOnTorus(Ids(1, 64, 8), 512, 3);
  EXPECT_EQ(f.steps, 14);
  EXPECT_EQ(f.bandwidth_factor, 2);
  // Ids of a second slice sit where the first slice's would.
  EXPECT_EQ(SpanOnTorus(Ids(512, 8), 512, 3).steps, 7);
  EXPECT_EQ(CompactSides(1024, 3), (std::vector<int64_t>{16, 8, 8}));
  // 2,048 v5p chips (16 x 16 x 8) under a (256 fsdp, 8 tensor) mesh: the tensor axis fills the
  // side of 8, a whole ring, and fsdp the other two; largest first it would be half a side.
  const std::vector<int64_t> mesh = {256, 8};
  EXPECT_EQ(TorusSidesFor(2048, 3, &mesh), (std::vector<int64_t>{8, 16, 16}));
  EXPECT_EQ(SpanOnTorus(Ids(0, 8), 2048, 3, &mesh).bandwidth_factor, 1);
  EXPECT_EQ(SpanOnTorus(Ids(0, 8), 2048, 3).bandwidth_factor, 0.5);
  const std::vector<int64_t> tp16 = {64, 16};  // 1,024 chips, 16 x 8 x 8: the 16 first
  EXPECT_EQ(TorusSidesFor(1024, 3, &tp16), (std::vector<int64_t>{16, 8, 8}));
}

TEST(CollectiveModelTest, FsdpOverATwoDimensionalSliceUsesBothDimensions) {
  // v5e-like: 16 x 16 chips, 100e9 B/s a dimension's ring. An all-gather of 1e7 B shards over
  // all 256: 255 * 1e7 / (2 * 100e9) + 30 steps; over one row of 16: 15 * 1e7 / 100e9 + 15.
  Hardware hw;
  hw.ring_bandwidth = 100e9;
  hw.torus_dims = 2;
  hw.devices_per_domain = 256;
  hw.link_latency = 5e-6;
  partition::CollectiveStat all = Stat("all-gather", 10000000, Ids(0, 256));
  all.mesh_devices = 256;
  EXPECT_TRUE(Close(CollectiveSeconds(all, hw).seconds, 255 * 1e7 / 200e9 + 30 * 5e-6));
  partition::CollectiveStat row = Stat("all-gather", 10000000, Ids(0, 16));
  row.mesh_devices = 256;
  EXPECT_TRUE(Close(CollectiveSeconds(row, hw).seconds, 15 * 1e7 / 100e9 + 15 * 5e-6));
  // A collective-permute to a neighbour: one link one way, half a dimension's ring.
  partition::CollectiveStat shift = Stat("collective-permute", 10000000, Ids(0, 16));
  shift.mesh_devices = 256;
  EXPECT_TRUE(Close(CollectiveSeconds(shift, hw).seconds, 1e7 / 50e9 + 5e-6));
}

TEST(CollectiveModelTest, EightGpusInOneHostAgainstSixteenOnTwo) {
  const Hardware hw = GpuCluster();
  const double s = 1e9;
  // 8 GPUs on one host, all-reduce of 1 GB: 2 * 7/8 * 1e9 / 450e9 + 14 * 3e-6.
  CollectiveTime one = CollectiveSeconds(Stat("all-reduce", 1000000000, Ids(0, 8)), hw);
  EXPECT_FALSE(one.crosses_hosts);
  EXPECT_EQ(one.algorithm, "ring");
  EXPECT_TRUE(Close(one.seconds, 2 * 7.0 / 8 * s / 450e9 + 14 * 3e-6)) << one.seconds;
  // 16 GPUs on two hosts, 8 on each: NCCL's 8 rings cross the hosts over 8 NICs, so the ring
  // runs at min(450e9, 8 x 50e9) = 400e9: 2 * 15/16 * 1e9 / 400e9 + 30 * 3e-6 = 4.7775e-3.
  // (One NIC for the whole ring, as the model had it: 3.75e-2 + 9e-5, 8x slower.)
  CollectiveTime two = CollectiveSeconds(Stat("all-reduce", 1000000000, Ids(0, 16)), hw);
  EXPECT_TRUE(two.crosses_hosts);
  EXPECT_EQ(two.algorithm, "ring");
  EXPECT_TRUE(Close(two.seconds, 4.7775e-3)) << two.seconds;
  // 16 GPUs on 16 hosts, one each: one NIC per member, 50e9: 3.75e-2 + 9e-5.
  CollectiveTime spread = CollectiveSeconds(Stat("all-reduce", 1000000000, Ids(0, 16, 8)), hw);
  EXPECT_TRUE(spread.crosses_hosts);
  EXPECT_TRUE(Close(spread.seconds, 3.759e-2)) << spread.seconds;
  // All-gather of a 1e8 B shard on the two hosts: 15 * 1e8 / 400e9 + 15 * 3e-6.
  CollectiveTime ag = CollectiveSeconds(Stat("all-gather", 100000000, Ids(0, 16)), hw);
  EXPECT_TRUE(Close(ag.seconds, 15 * 1e8 / 400e9 + 15 * 3e-6)) << ag.seconds;
}

TEST(CollectiveModelTest, TinyAllReduceOnEightThousandChipsCostsMicroseconds) {
  // 4 bytes over 8,192 chips of one 3-D torus: a flat ring would take 2 * 8191 steps of 5 us =
  // 82 ms; a ring per dimension of 32 x 16 x 16, 2 * 61 steps = 0.61 ms; a tree 2 * 13 steps =
  // 130 us.
  CollectiveTime t = CollectiveSeconds(Stat("all-reduce", 4, Ids(0, 8192)), TpuSlices(0));
  EXPECT_EQ(t.algorithm, "tree");
  EXPECT_TRUE(Close(t.seconds, 2 * 4 / (0.92 * 200e9) + 26 * 5e-6)) << t.seconds;
  // The same on 8,192 GPUs (1,024 hosts): the tree's 26 steps of 3 us.
  CollectiveTime g = CollectiveSeconds(Stat("all-reduce", 4, Ids(0, 8192)), GpuCluster());
  EXPECT_EQ(g.algorithm, "tree");
  EXPECT_LT(g.seconds, 1e-4);
  // A large all-reduce stays on the ring (a ring per dimension of 16 x 16 x 16: 2 * 45 steps,
  // the three dimensions' links at once: 3 x 200e9): the tree's 2 s at 0.92 x one dimension's
  // bandwidth costs more than its fewer steps save.
  CollectiveTime big = CollectiveSeconds(Stat("all-reduce", 1000000000, Ids(0, 4096)), TpuSlices(0));
  EXPECT_EQ(big.algorithm, "ring");
  EXPECT_TRUE(Close(big.seconds, 2 * 4095.0 / 4096 * 1e9 / 600e9 + 90 * 5e-6)) << big.seconds;
}

TEST(CollectiveModelTest, MultiSliceTrafficCrossesDcn) {
  const double s = 1e8;
  // 8 chips on two slices of 4. Inside one slice (the slice boundary unknown to the model,
  // devices_per_domain = 0) the all-reduce rides ICI, a 2 x 2 x 2 torus, all three dimensions
  // at once: 2 * 7/8 * 1e8 / (3 * 200e9) + 2 * RingSteps(8) steps of 5 us.
  CollectiveTime ici = CollectiveSeconds(Stat("all-reduce", 100000000, Ids(0, 8)), TpuSlices(0));
  EXPECT_FALSE(ici.crosses_hosts);
  EXPECT_TRUE(Close(ici.seconds, 2 * 7.0 / 8 * s / 600e9 + 2 * RingSteps(8, 3) * 5e-6)) << ici.seconds;
  // With 4-chip slices, hierarchically: reduce-scatter over each slice's 4 chips (a 2 x 2 x 1
  // torus, two dimensions at once: 3/4 * 1e8 / 400e9 + 2 steps), all-reduce across the 2
  // slices of each chip's quarter over its DCN (2 * 1/2 * 2.5e7 / 6.25e9 + 2 steps), all-gather
  // in the slice again.
  CollectiveTime dcn = CollectiveSeconds(Stat("all-reduce", 100000000, Ids(0, 8)), TpuSlices(4));
  EXPECT_TRUE(dcn.crosses_hosts);
  EXPECT_EQ(dcn.algorithm, "hierarchical");
  const double intra = 0.75 * s / 400e9 + RingSteps(4, 3) * 5e-6;
  EXPECT_TRUE(Close(dcn.seconds, 2 * intra + 2.5e7 / 6.25e9 + 2 * 5e-6)) << dcn.seconds;
  EXPECT_GT(dcn.seconds, 4 * ici.seconds);
  // A data-parallel axis across slices, one chip in each: everything over one DCN link.
  CollectiveTime dp = CollectiveSeconds(Stat("all-reduce", 100000000, {0, 4}), TpuSlices(4));
  EXPECT_TRUE(Close(dp.seconds, s / 6.25e9 + 2 * 5e-6)) << dp.seconds;
  // A reduce-scatter across the slices: inside first, then the quarter across.
  CollectiveTime rs = CollectiveSeconds(Stat("reduce-scatter", 100000000, Ids(0, 8)), TpuSlices(4));
  EXPECT_EQ(rs.algorithm, "hierarchical");
  EXPECT_TRUE(Close(rs.seconds, intra + 0.5 * 2.5e7 / 6.25e9 + 5e-6)) << rs.seconds;
  // An all-gather: the shard across slices first, then the slice's gathered pieces inside.
  CollectiveTime ag = CollectiveSeconds(Stat("all-gather", 1000000, Ids(0, 8)), TpuSlices(4));
  EXPECT_EQ(ag.algorithm, "hierarchical");
  EXPECT_TRUE(Close(ag.seconds, 1e6 / 6.25e9 + 5e-6 + 3 * 2e6 / 400e9 + RingSteps(4, 3) * 5e-6))
      << ag.seconds;
}

TEST(CollectiveModelTest, AllToAllAndPermuteAcrossHosts) {
  const Hardware hw = GpuCluster();
  // All-to-all over 16 GPUs on two hosts: 7/16 of the buffer stays on the host (NVLink), 8/16
  // leaves it through each GPU's own NIC; the NIC part is the longer.
  CollectiveTime a2a = CollectiveSeconds(Stat("all-to-all", 16000000, Ids(0, 16)), hw);
  EXPECT_EQ(a2a.algorithm, "pairwise");
  EXPECT_TRUE(Close(a2a.seconds, 8e6 / 50e9 + 15 * 3e-6)) << a2a.seconds;
  // Inside one host: (n-1)/n of it over NVLink.
  CollectiveTime local = CollectiveSeconds(Stat("all-to-all", 8000000, Ids(0, 8)), hw);
  EXPECT_TRUE(Close(local.seconds, 7e6 / 450e9 + 7 * 3e-6)) << local.seconds;
  // A permute across hosts: one exchange through the NIC.
  CollectiveTime cp = CollectiveSeconds(Stat("collective-permute", 1000000, Ids(0, 16)), hw);
  EXPECT_EQ(cp.algorithm, "exchange");
  EXPECT_TRUE(Close(cp.seconds, 1e6 / 50e9 + 3e-6)) << cp.seconds;
}

}  // namespace
}  // namespace spmd::plan
