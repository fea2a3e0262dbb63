#include "partition/cost_model.h"

#include <algorithm>

namespace spmd::partition {

double Hardware::PeakFlops(DType dtype) const {
  return dtype == DType::kBFloat16 || dtype == DType::kFloat16 ? peak_flops_bf16 : peak_flops_fp32;
}

double OpSeconds(const OpCost& op, const Hardware& hw) {
  const double compute = op.flops > 0 ? op.flops / hw.PeakFlops(op.dtype) : 0;
  const double memory = hw.hbm_bandwidth > 0 ? op.bytes / hw.hbm_bandwidth : 0;
  return std::max(compute, memory);
}

CollectiveTime CollectiveSeconds(const CollectiveStat& c, const Hardware& hw) {
  CollectiveTime t;
  t.kind = c.kind;
  const double n = static_cast<double>(c.group_size);
  if (n <= 1) return t;
  if (hw.devices_per_host > 0 && !c.first_group.empty()) {
    auto [lo, hi] = std::minmax_element(c.first_group.begin(), c.first_group.end());
    t.crosses_hosts = *lo / hw.devices_per_host != *hi / hw.devices_per_host;
  }
  const double bandwidth = t.crosses_hosts ? hw.cross_host_bandwidth : hw.ring_bandwidth;
  const double s = static_cast<double>(c.bytes);  // each device's input buffer
  double bytes_sent = 0, steps = n - 1;
  if (c.kind == "all-gather") {
    bytes_sent = (n - 1) * s;  // the input is one shard of the gathered n * s
  } else if (c.kind == "reduce-scatter" || c.kind == "all-to-all") {
    bytes_sent = (n - 1) / n * s;
  } else if (c.kind == "all-reduce") {
    bytes_sent = 2 * (n - 1) / n * s;
    steps = 2 * (n - 1);
  } else {  // collective-permute: one exchange with a neighbour
    bytes_sent = s;
    steps = 1;
  }
  t.seconds = bytes_sent / bandwidth + steps * hw.link_latency;
  return t;
}

StepEstimate EstimateStep(const ProgramStats& stats, const Hardware& hw) {
  StepEstimate e;
  for (const OpCost& op : stats.op_costs) {
    e.op_seconds.push_back(OpSeconds(op, hw));
    e.compute_seconds += e.op_seconds.back();
  }
  for (const CollectiveStat& c : stats.collectives) {
    e.collective_seconds.push_back(CollectiveSeconds(c, hw));
    e.communication_seconds += e.collective_seconds.back().seconds;
  }
  e.step_seconds = e.compute_seconds + e.communication_seconds;
  e.overlapped_step_seconds = std::max(e.compute_seconds, e.communication_seconds);
  return e;
}

}  // namespace spmd::partition
