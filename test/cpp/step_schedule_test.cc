// The two-stream schedule of a step (plan/step_schedule.h) on hand-built statistics: ops
// and collectives at program positions, with durations given, against schedules worked out by
// hand.
#include "plan/step_schedule.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "graph_test_util.h"

namespace spmd::plan {
using namespace spmd::partition;  // the compiler's types the model reads
namespace {

using testing::Close;

// Ops at program positions 10, 20, 30, ... (one per entry of `positions`).
ProgramStats Ops(const std::vector<int64_t>& positions) {
  ProgramStats stats;
  for (int64_t p : positions) {
    OpCost op;
    op.position = p;
    stats.op_costs.push_back(op);
  }
  return stats;
}

CollectiveStat At(const std::string& kind, int64_t position, int64_t input, int64_t first_use) {
  CollectiveStat c;
  c.kind = kind;
  c.position = position;
  c.input_position = input;
  c.first_use_position = first_use;
  return c;
}

TEST(StepScheduleTest, AllGatherOfAParameterOverlapsTheOpsBeforeItsReader) {
  // op 0 at 10, op 1 at 20 reads an all-gather (at 19) of a parameter; 1 s each.
  ProgramStats stats = Ops({10, 20});
  stats.collectives = {At("all-gather", 19, -1, 20)};
  // 0.5 s of gather hides under op 0: the step is the ops' 2 s.
  StepSchedule s = ScheduleStep(stats, {1, 1}, {0.5});
  EXPECT_EQ(s.collective_start[0], 0.0);
  EXPECT_EQ(s.op_start[1], 1.0);
  EXPECT_EQ(s.seconds, 2.0);
  EXPECT_EQ(s.collective_exposed[0], 0.0);
  // 1.5 s of gather: op 1 waits 0.5 s for it.
  s = ScheduleStep(stats, {1, 1}, {1.5});
  EXPECT_EQ(s.op_start[1], 1.5);
  EXPECT_EQ(s.seconds, 2.5);
  EXPECT_EQ(s.collective_exposed[0], 0.5);
}

TEST(StepScheduleTest, TheDeviceRunsAheadOnlyAsFarAsTheHostHasIssued) {
  // Three kernels issued 1 s apart by the host. Short ones (0.25 s) each wait for their issue:
  // the step is 3.25 s, 2.5 s of it waiting. Long ones (2 s) hide the host's issuing
  // after the first: the step is 1 + 3 x 2 s. An op that launches nothing (a view) costs no
  // issue time.
  ProgramStats stats = Ops({10, 20, 30});
  StepSchedule s = ScheduleStep(stats, {0.25, 0.25, 0.25}, {}, 
                    {.launches = {true, true, true}, .kernel_overhead = 1.0});
  EXPECT_EQ(s.op_start[2], 3.0);
  EXPECT_EQ(s.seconds, 3.25);
  EXPECT_EQ(s.host_bound_seconds, 2.5);
  s = ScheduleStep(stats, {2, 2, 2}, {}, 
                    {.launches = {true, true, true}, .kernel_overhead = 1.0});
  EXPECT_EQ(s.seconds, 7.0);
  EXPECT_EQ(s.host_bound_seconds, 1.0);
  s = ScheduleStep(stats, {0.25, 0.25, 0.25}, {}, 
                    {.launches = {true, false, true}, .kernel_overhead = 1.0});
  EXPECT_EQ(s.op_start[1], 1.25);
  EXPECT_EQ(s.seconds, 2.25);
}

TEST(StepScheduleTest, ACollectiveStartsWhenItsInputIsMadeAndTheStreamIsFree) {
  // Three ops of 1 s at 10, 20, 30. A reduce-scatter (at 21) of op 1's result, read only as an
  // output: it runs beside op 2.
  ProgramStats stats = Ops({10, 20, 30});
  stats.collectives = {At("reduce-scatter", 21, 20, 40)};
  StepSchedule s = ScheduleStep(stats, {1, 1, 1}, {0.5});
  EXPECT_EQ(s.collective_start[0], 2.0);
  EXPECT_EQ(s.seconds, 3.0);
  // 1.5 s: it outlasts op 2 by 0.5 s, charged to it.
  s = ScheduleStep(stats, {1, 1, 1}, {1.5});
  EXPECT_EQ(s.seconds, 3.5);
  EXPECT_EQ(s.collective_exposed[0], 0.5);

  // The communication stream takes collectives as their inputs become ready: an all-gather
  // of a parameter read by op 2 (at 29) does not wait behind a reduce-scatter of op 1's result
  // (at 21), 1 s each: it runs first, under ops 0 and 1, and the reduce-scatter under op 2.
  stats.collectives = {At("reduce-scatter", 21, 20, 40), At("all-gather", 29, -1, 30)};
  s = ScheduleStep(stats, {1, 1, 1}, {1, 1});
  EXPECT_EQ(s.collective_start[1], 0.0);
  EXPECT_EQ(s.collective_start[0], 2.0);
  EXPECT_EQ(s.op_start[2], 2.0);
  EXPECT_EQ(s.seconds, 3.0);
  // Among collectives ready when the stream is free, the earlier in the program goes first.
  stats.collectives = {At("all-gather", 19, -1, 20), At("all-gather", 29, -1, 30)};
  s = ScheduleStep(stats, {1, 1, 1}, {1, 1});
  EXPECT_EQ(s.collective_start[0], 0.0);
  EXPECT_EQ(s.collective_start[1], 1.0);
}

TEST(StepScheduleTest, ACollectiveInsideAnOpsLoweringFollowsThatOp) {
  // Op 0's lowering (nodes 10..14) makes an all-reduce (at 12) of its own node 11 and reads it
  // at 13: the op is atomic, so the all-reduce runs after it and op 1 waits for it.
  ProgramStats stats = Ops({10, 15});
  stats.collectives = {At("all-reduce", 12, 11, 13)};
  StepSchedule s = ScheduleStep(stats, {1, 1}, {0.25});
  EXPECT_EQ(s.collective_start[0], 1.0);
  EXPECT_EQ(s.op_start[1], 1.25);
  EXPECT_EQ(s.seconds, 2.25);
}

TEST(StepScheduleTest, BoundsAndExposedTime) {
  // FSDP-like: every op reads a gather issued right before it; gathers of 0.6 s, ops of 1 s.
  ProgramStats stats = Ops({10, 20, 30, 40});
  for (int64_t p : {10, 20, 30, 40}) stats.collectives.push_back(At("all-gather", p - 1, -1, p));
  const std::vector<double> ops = {1, 1, 1, 1}, gathers = {0.6, 0.6, 0.6, 0.6};
  StepSchedule s = ScheduleStep(stats, ops, gathers);
  // Only the first gather is exposed: 0.6 + 4.
  EXPECT_TRUE(Close(s.seconds, 4.6));
  double exposed = 0;
  for (double e : s.collective_exposed) exposed += e;
  EXPECT_TRUE(Close(exposed, s.seconds - 4.0));
  EXPECT_GE(s.seconds, 4.0);         // max(compute, communication)
  EXPECT_LE(s.seconds, 4.0 + 2.4);   // compute + communication
}

TEST(StepScheduleTest, PrefetchLimitHoldsAllGathersBack) {
  // Ops of 2 s at 10, 20, 30, each reading a 0.5 s gather of a parameter issued before it.
  ProgramStats stats = Ops({10, 20, 30});
  for (int64_t p : {10, 20, 30}) stats.collectives.push_back(At("all-gather", p - 1, -1, p));
  const std::vector<double> ops = {2, 2, 2}, gathers = {0.5, 0.5, 0.5};
  // Unlimited: the gathers run back to back from the start.
  StepSchedule free = ScheduleStep(stats, ops, gathers);
  EXPECT_EQ(free.collective_start[2], 1.0);
  // One gather ahead: the third may go once op 1 (which reads the second) is reached, at the
  // end of op 0: 0.5 + 2 = 2.5.
  StepSchedule one = ScheduleStep(stats, ops, gathers, {.all_gather_prefetch = 1});
  EXPECT_EQ(one.collective_start[1], 0.5);
  EXPECT_EQ(one.collective_start[2], 2.5);
  EXPECT_EQ(one.seconds, free.seconds);  // still hidden under 2 s ops
}

TEST(StepScheduleTest, CommunicationFreeOpsRunFirst) {
  // FSDP's program order: layer 1's transposed weight shard (op 0 at 10), its all-gather (at
  // 11), its matmul (op 1 at 12); layer 2's transpose (op 2 at 20), all-gather (21), matmul
  // (op 3 at 22). Transposes take 0.1 s, matmuls 1 s, gathers 1 s.
  ProgramStats stats = Ops({10, 12, 20, 22});
  stats.collectives = {At("all-gather", 11, 10, 12), At("all-gather", 21, 20, 22)};
  const std::vector<double> ops = {0.1, 1, 0.1, 1}, gathers = {1, 1};
  // In program order the second gather waits for the second transpose, after the first
  // matmul: 0.1 + 1 (gather) + 1 (matmul) + 0.1 + 1 (gather) + 1 = 4.2.
  StepSchedule in_order = ScheduleStep(stats, ops, gathers);
  EXPECT_TRUE(Close(in_order.seconds, 4.2));
  // The transposes need no communication: both run first; the first gather starts after the
  // first transpose (0.1 to 1.1), the second right after it (1.1 to 2.1), beside the first
  // matmul: 0.1 + 1 + 1 + 1 = 3.1.
  stats.op_costs[0].independent_of_collectives = true;
  stats.op_costs[2].independent_of_collectives = true;
  StepSchedule hoisted = ScheduleStep(stats, ops, gathers);
  EXPECT_TRUE(Close(hoisted.op_start[2], 0.1));
  EXPECT_TRUE(Close(hoisted.collective_start[1], 1.1));
  EXPECT_TRUE(Close(hoisted.op_start[1], 1.1));
  EXPECT_TRUE(Close(hoisted.op_start[3], 2.1));
  EXPECT_TRUE(Close(hoisted.seconds, 3.1));
}

TEST(StepScheduleTest, UnknownPositionsMeanNoOverlap) {
  // Statistics without positions (input and first use -1): read before the first op.
  ProgramStats stats = Ops({0, 0});
  CollectiveStat c;
  c.kind = "all-reduce";
  stats.collectives = {c};
  StepSchedule s = ScheduleStep(stats, {1, 1}, {0.5});
  EXPECT_EQ(s.op_start[0], 0.5);
  EXPECT_EQ(s.seconds, 2.5);
}

TEST(StepScheduleTest, PermutesOfOppositeDirectionsShareATorusBesideEachOther) {
  // Two permutes of parameters read by op 1 (at 20), 1 s each, one toward each neighbour
  // (channels 1 and 2); op 0 takes 1 s. On a torus each direction has links of its own: both
  // run during op 0, and op 1 starts at 1 s. On a switch (or in one direction) they queue:
  // op 1 waits until 2 s. A collective on every link (channel 0) waits for both directions.
  ProgramStats stats = Ops({10, 20});
  stats.collectives = {At("collective-permute", 18, -1, 20), At("collective-permute", 19, -1, 20)};
  stats.collectives[0].channel = 1;
  stats.collectives[1].channel = 2;
  StepSchedule torus = ScheduleStep(stats, {1, 1}, {1, 1}, {.directions_apart = true});
  EXPECT_EQ(torus.collective_start[1], 0.0);
  EXPECT_EQ(torus.op_start[1], 1.0);
  EXPECT_EQ(torus.seconds, 2.0);
  StepSchedule one_stream = ScheduleStep(stats, {1, 1}, {1, 1});
  EXPECT_EQ(one_stream.collective_start[1], 1.0);
  EXPECT_EQ(one_stream.op_start[1], 2.0);
  stats.collectives[1].channel = 1;  // the same direction: one after the other
  StepSchedule same = ScheduleStep(stats, {1, 1}, {1, 1}, {.directions_apart = true});
  EXPECT_EQ(same.op_start[1], 2.0);
  stats.collectives[1].channel = 0;  // every link: after the first permute
  StepSchedule all = ScheduleStep(stats, {1, 1}, {1, 1}, {.directions_apart = true});
  EXPECT_EQ(all.collective_start[1], 1.0);
  EXPECT_EQ(all.seconds, 3.0);
}

TEST(StepScheduleTest, TheHostLinkDoesNotReorderTheLinksCollectives) {
  // The link is busy with a gather of a parameter (1 s). Two more wait: one early in the
  // program whose input op 0 makes at 0.5 s, one later whose input (a parameter) is there from
  // the start. When the link frees up at 1 s both are ready: the earlier in the program goes
  // first, as without the host link's idle streams (which must not count as a free link).
  ProgramStats stats = Ops({10, 40});
  stats.collectives = {At("all-gather", 5, -1, 40), At("all-gather", 20, 10, 40),
                       At("all-gather", 30, -1, 40), At("device-to-host", 11, 10, 40)};
  stats.collectives[3].channel = 3;
  StepSchedule s = ScheduleStep(stats, {0.5, 1}, {1, 1, 1, 0.1}, {.directions_apart = true});
  EXPECT_EQ(s.collective_start[1], 1.0);
  EXPECT_EQ(s.collective_start[2], 2.0);
  EXPECT_EQ(s.collective_start[3], 0.5);  // beside the link, once its input is made
}

TEST(StepScheduleTest, AGradientReductionWaitsForTheBackwardWhereTheRuntimeSaysSo) {
  // Backward ops 0 and 1 (1 s each), then the optimizer's op 2 reads the all-reduce (1 s) of
  // the gradient op 0 made. Overlapped, it runs beside op 1 and the step is 3 s; reduced after
  // the backward (Megatron-LM's default), it starts when op 1 ends and op 2 waits for it.
  ProgramStats stats = Ops({10, 20, 30});
  stats.op_costs[0].in_backward = stats.op_costs[1].in_backward = true;
  stats.collectives = {At("all-reduce", 29, 10, 30)};
  stats.collectives[0].after_backward = true;
  StepSchedule overlapped = ScheduleStep(stats, {1, 1, 1}, {1});
  EXPECT_EQ(overlapped.collective_start[0], 1.0);
  EXPECT_EQ(overlapped.seconds, 3.0);
  StepSchedule after = ScheduleStep(stats, {1, 1, 1}, {1}, {.gradients_after_backward = true});
  EXPECT_EQ(after.collective_start[0], 2.0);
  EXPECT_EQ(after.seconds, 4.0);
  EXPECT_EQ(after.collective_exposed[0], 1.0);
  // A reduction the backward itself reads (an input gradient's, in tensor parallelism) is not
  // a gradient's and never waits.
  stats.collectives[0].after_backward = false;
  EXPECT_EQ(ScheduleStep(stats, {1, 1, 1}, {1}, {.gradients_after_backward = true})
                .collective_start[0], 1.0);
}

}  // namespace
}  // namespace spmd::plan
