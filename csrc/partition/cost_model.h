// Predicted step time of a partitioned program on real hardware, from the program's own
// statistics (per-op FLOPs and bytes from the sharding rules, every collective with its group
// and bytes) and a hardware description. Torch-free: plan mode and executed steps share it.
//
// The model, and what it leaves out (docs/plan_mode.md):
// - a local op takes max(FLOPs / peak FLOP/s for its dtype, bytes / HBM bandwidth) (roofline);
// - a collective over a group of n devices moves, per device, (n-1)/n of the gathered or
//   reduced buffer (all-reduce twice: reduce-scatter then all-gather) over the bandwidth of a
//   ring through the group, plus (n-1) link latencies (2(n-1) for all-reduce): the ring
//   formulas of NCCL's performance notes. A group inside one host (NVLink, or a TPU slice's
//   ICI torus) rides `ring_bandwidth`; a group that crosses hosts rides `cross_host_bandwidth`;
// - no overlap of compute and communication (`step_seconds`), and a lower bound with full
//   overlap (`overlapped_step_seconds`); no kernel launch overhead, no host time.
#pragma once
#include <string>
#include <vector>

#include "core/dtype.h"
#include "partition/program.h"

namespace spmd::partition {

struct Hardware {
  std::string name;
  double peak_flops_bf16 = 0;  // per device, dense matmul
  double peak_flops_fp32 = 0;  // per device, what an fp32 matmul gets by default
  double hbm_bytes = 0;        // per device
  double hbm_bandwidth = 0;    // bytes/s per device
  double ring_bandwidth = 0;   // bytes/s one device sends along a ring inside a host / slice
  double cross_host_bandwidth = 0;  // bytes/s per device for groups that span hosts
  double link_latency = 0;     // seconds per ring step
  int64_t devices_per_host = 0;  // 0: every device on one interconnect (a TPU slice)

  double PeakFlops(DType dtype) const;
};

struct CollectiveTime {
  std::string kind;
  double seconds = 0;
  bool crosses_hosts = false;
};

struct StepEstimate {
  double compute_seconds = 0;
  double communication_seconds = 0;
  double step_seconds = 0;             // compute + communication (no overlap)
  double overlapped_step_seconds = 0;  // max(compute, communication)
  std::vector<double> op_seconds;      // per ProgramStats::op_costs entry
  std::vector<CollectiveTime> collective_seconds;  // per ProgramStats::collectives entry
};

double OpSeconds(const OpCost& op, const Hardware& hw);
CollectiveTime CollectiveSeconds(const CollectiveStat& c, const Hardware& hw);
StepEstimate EstimateStep(const ProgramStats& stats, const Hardware& hw);

}  // namespace spmd::partition
