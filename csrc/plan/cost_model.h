// Predicted step time of a partitioned program on real hardware, from the program's own
// statistics (per-op FLOPs and bytes from the sharding rules, every collective with its group,
// bytes and program positions) and a hardware description (plan/hardware.h). Torch-free:
// plan mode and executed steps share it. The assumptions, one by one: docs/plan_mode.md.
//
// - An op takes max(compute, memory) (roofline). Compute: FLOPs / (peak FLOP/s for its dtype),
//   for a contraction also x matmul_efficiency and x the fraction of its padded GEMM that is
//   real work (each of M, N, K padded to matmul_tile) and, on GPUs, x the fraction of the SMs
//   its output tiles keep busy (Hardware::matrix_units). Memory: the bytes it moves to and from
//   HBM (its operands and results, less those a fused pointwise chain keeps on chip) /
//   (hbm_bandwidth x hbm_efficiency). A view (ShardingRule::view: a reshape, transpose,
//   broadcast or slice, a *_copy op in the functional IR) takes no time and issues no kernel.
// - A collective takes the fastest of the algorithms plan/collective_model.h describes,
//   given where its group sits on the interconnect.
// - The step is the critical path of a compute stream and a communication stream
//   (plan/step_schedule.h), which also waits for the host to issue each kernel
//   (Hardware::kernel_overhead), and at least the smooth maximum of the host's issue time and
//   the device's own critical path (HostDeviceSeconds).
#pragma once
#include <algorithm>
#include <vector>

#include "partition/program.h"
#include "plan/collective_model.h"
#include "plan/hardware.h"

namespace spmd::plan {

// The compiler's types this floor reads.
using partition::CollectiveStat;
using partition::OpCost;
using partition::Program;
using partition::ProgramStats;

struct OpTime {
  double compute = 0;    // at the achieved FLOP rate
  double memory = 0;     // at the achieved HBM bandwidth
  bool launches = false;  // a kernel of its own: computes, or moves bytes not fused away
  double seconds() const { return compute > memory ? compute : memory; }
  bool compute_bound() const { return compute >= memory; }
};

struct StepEstimate {
  double compute_seconds = 0;        // the ops, one after another
  double compute_bound_seconds = 0;  // of which ops limited by their FLOPs
  double memory_bound_seconds = 0;   // and ops limited by their HBM traffic
  // The compute stream idle while the host still issues kernels (Hardware::kernel_overhead).
  double host_bound_seconds = 0;
  // The collectives one after another, those of opposite directions on a torus beside each
  // other (CollectiveStat::channel): how long the links are busy.
  double communication_seconds = 0;
  // Copies between device and host memory (partition/offload.h), one after another: on the
  // host link's own streams, not in communication_seconds.
  double host_transfer_seconds = 0;
  double step_seconds = 0;           // the two-stream schedule's critical path
  // Time the compute stream waits for communication: step_seconds - compute_seconds.
  double exposed_communication_seconds = 0;
  double no_overlap_step_seconds = 0;   // compute + communication: the upper bound
  double overlapped_step_seconds = 0;   // max(compute, communication): the lower bound
  std::vector<OpTime> op_times;         // per ProgramStats::op_costs entry
  std::vector<double> op_start;         // in the schedule
  std::vector<CollectiveTime> collective_seconds;  // per ProgramStats::collectives entry
};

// The fraction of a padded GEMM that is real work: m n k over the product of each extent
// rounded up to a multiple of `tile` (1 when the tile or the shape is unknown).
double TileEfficiency(int64_t m, int64_t n, int64_t k, int64_t tile);
// The fraction of `units` busy over the waves `tiles` output tiles run in.
double WaveEfficiency(int64_t tiles, int64_t units);
// A contraction's fraction of the matrix units' peak from its shape: tile padding, and on
// hardware with Hardware::matrix_units, wave quantization at the better of two tile sides.
double GemmEfficiency(const OpCost& op, const Hardware& hw);
OpTime OpSeconds(const OpCost& op, const Hardware& hw);
// An eager runtime's step from the host's total issue time and the device's own critical
// path: their maximum when one dominates, more near balance, where the host's issue times per
// kernel vary (a Python module call, an autograd node, a hook) and the device starves behind
// the slow stretches: the smooth maximum (host^3 + device^3)^(1/3), 1.26x the maximum at
// balance. The exponent is fitted once, on vTrain's A100 runs (docs/plan_mode.md), and holds for
// every preset with a kernel overhead.
double HostDeviceSeconds(double host, double device);
StepEstimate EstimateStep(const ProgramStats& stats, const Hardware& hw);

}  // namespace spmd::plan
