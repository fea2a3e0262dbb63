// The step as two streams, the way XLA's latency-hiding scheduler (TPU) and FSDP's prefetching
// over NCCL streams (GPU) run it: a compute stream runs the ops, a communication stream runs
// the collectives one at a time.
// - The compute stream runs first the ops that depend on no collective's result
//   (OpCost::independent_of_collectives: a weight's transpose before its all-gather, a
//   data-parallel backward), then the others, each group in program order: the scheduler
//   issues communication-free work early so that collectives can start early.
// - A collective may start once the op producing its input is done (a parameter is there
//   from the start). When the communication stream is free it starts, of the collectives that
//   may start, the earliest in program order; if none may yet, the first that will. (Strict
//   program order would hold FSDP's next all-gather behind the previous layer's gradient
//   reduce-scatter, which FSDP issues on a stream of its own and XLA reorders.)
// - The compute stream waits for a collective only at the first op that reads its result.
//   Ops are atomic: a collective made or read inside an op's own lowering (after its first
//   node) follows that op and is waited for before the next.
// The step ends when both streams are done. Its length lies between max(compute,
// communication) (everything overlapped) and compute + communication (nothing overlapped).
//
// On a torus (`directions_apart`), the communication stream is two: collectives of channel 1
// and 2 (`channels`, default CollectiveStat::channel: permutes toward the previous or the next
// member of a ring) each take one direction's links and run beside each other; the rest take
// both. Transfers over the host link (channels 3 and 4: to the host memory, back from it) run
// on a stream each, beside all of those; a copy back may start only once the compute stream
// has reached the reader of the copy back before it (one ahead of its reader, as offloading
// runtimes prefetch).
//
// With `all_gather_prefetch` = L > 0, an all-gather may not be issued before the compute stream
// reaches the first reader of the all-gather L before it (at most L gathered buffers waiting
// for their readers), nor held back past its own place in the program.
//
// With `gradients_after_backward`, a gradient's reduction (CollectiveStat::after_backward) may
// not start before the backward's last op is done: the runtime reduces once the backward is
// over (Megatron-LM without --overlap-grad-reduce), so none of it hides behind the backward.
#pragma once
#include <vector>

#include "partition/program.h"

namespace spmd::plan {

// The compiler's types this floor reads.
using partition::CollectiveStat;
using partition::OpCost;
using partition::ProgramStats;

struct StepSchedule {
  double seconds = 0;                   // both streams done
  std::vector<double> op_start;         // per ProgramStats::op_costs entry
  std::vector<double> collective_start; // per ProgramStats::collectives entry
  // The compute stream's waiting, each wait charged to the collective it waited for last (the
  // communication still running after the last op, to the last collective): they add up to
  // seconds - the ops' total.
  std::vector<double> collective_exposed;
  double host_bound_seconds = 0;  // the compute stream idle, waiting for the host to issue
};

struct ScheduleOptions {
  int64_t all_gather_prefetch = 0;  // Hardware::all_gather_prefetch
  // `launches[k]`: op k is a kernel the host issues, `kernel_overhead` seconds each, in the
  // compute stream's order: the device runs ahead only as far as the host has issued.
  std::vector<bool> launches;
  double kernel_overhead = 0;
  bool directions_apart = false;  // a torus: the two directions of its links apart
  std::vector<int> channels;      // per collective; empty: CollectiveStat::channel
  bool gradients_after_backward = false;  // !Hardware::overlap_grad_reduce
};

// `op_seconds` and `collective_seconds` run parallel to stats.op_costs and stats.collectives.
StepSchedule ScheduleStep(const ProgramStats& stats, const std::vector<double>& op_seconds,
                          const std::vector<double>& collective_seconds,
                          const ScheduleOptions& options = {});

}  // namespace spmd::plan
