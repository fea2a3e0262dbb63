#include "plan/cost_model.h"

#include <algorithm>
#include <cmath>

#include "plan/step_schedule.h"

namespace spmd::plan {

double TileEfficiency(int64_t m, int64_t n, int64_t k, int64_t tile) {
  if (tile <= 0 || m <= 0 || n <= 0 || k <= 0) return 1;
  auto padded = [tile](int64_t x) { return static_cast<double>((x + tile - 1) / tile * tile); };
  return static_cast<double>(m) / padded(m) * static_cast<double>(n) / padded(n) *
         static_cast<double>(k) / padded(k);
}

double WaveEfficiency(int64_t tiles, int64_t units) {
  if (units <= 0 || tiles <= 0) return 1;
  const int64_t waves = (tiles + units - 1) / units;
  return static_cast<double>(tiles) / static_cast<double>(waves * units);
}

double GemmEfficiency(const OpCost& op, const Hardware& hw) {
  auto at = [&](int64_t t) {
    double e = TileEfficiency(op.gemm_m, op.gemm_n, op.gemm_k, t);
    if (t > 0 && op.gemm_m > 0 && op.gemm_n > 0)
      e *= WaveEfficiency(op.gemm_batch * ((op.gemm_m + t - 1) / t) * ((op.gemm_n + t - 1) / t),
                          hw.matrix_units);
    return e;
  };
  const int64_t tile = hw.matmul_tile;
  if (hw.matrix_units <= 0 || tile < 2) return at(tile);
  return std::max(at(tile), at(tile / 2));
}

OpTime OpSeconds(const OpCost& op, const Hardware& hw) {
  OpTime t;
  if (op.view) return t;  // a strided view of its operand: no kernel, no bytes moved
  if (op.flops > 0) {
    double rate = hw.PeakFlops(op.dtype);
    if (op.contraction)
      rate *= hw.matmul_efficiency * GemmEfficiency(op, hw);
    t.compute = op.flops / rate;
  }
  if (hw.hbm_bandwidth > 0)
    t.memory = static_cast<double>(op.bytes - op.fused_bytes) /
               (hw.hbm_bandwidth * hw.hbm_efficiency);
  // A kernel is launched for an op that computes or moves bytes of its own; one fused into its
  // producer (all its bytes fused) is not.
  t.launches = op.flops > 0 || op.bytes > op.fused_bytes;
  return t;
}

double HostDeviceSeconds(double host, double device) {
  if (host <= 0 || device <= 0) return std::max(host, device);
  return std::cbrt(host * host * host + device * device * device);
}

StepEstimate EstimateStep(const ProgramStats& stats, const Hardware& hw) {
  StepEstimate e;
  std::vector<double> op_seconds, collective_seconds;
  std::vector<bool> launches;
  for (const OpCost& op : stats.op_costs) {
    e.op_times.push_back(OpSeconds(op, hw));
    const OpTime& t = e.op_times.back();
    op_seconds.push_back(t.seconds());
    (t.compute_bound() ? e.compute_bound_seconds : e.memory_bound_seconds) += t.seconds();
    launches.push_back(t.launches);
    e.compute_seconds += t.seconds();
  }
  const bool directions_apart = hw.torus_dims > 0;
  double one_way[2] = {0, 0};  // permutes of each direction, beside each other on a torus
  std::vector<int> channels;
  for (const CollectiveStat& c : stats.collectives) {
    e.collective_seconds.push_back(CollectiveSeconds(c, hw));
    const CollectiveTime& t = e.collective_seconds.back();
    collective_seconds.push_back(t.seconds);
    channels.push_back(t.channel);
    if (t.channel >= 3)
      e.host_transfer_seconds += t.seconds;
    else if (directions_apart && t.channel > 0)
      one_way[t.channel - 1] += t.seconds;
    else
      e.communication_seconds += t.seconds;
  }
  e.communication_seconds += std::max(one_way[0], one_way[1]);
  ScheduleOptions options{.all_gather_prefetch = hw.all_gather_prefetch,
                          .launches = launches,
                          .kernel_overhead = hw.kernel_overhead,
                          .directions_apart = directions_apart,
                          .channels = channels,
                          .gradients_after_backward = !hw.overlap_grad_reduce};
  StepSchedule s = ScheduleStep(stats, op_seconds, collective_seconds, options);
  for (size_t j = 0; j < e.collective_seconds.size(); ++j) {
    e.collective_seconds[j].start = s.collective_start[j];
    e.collective_seconds[j].exposed_seconds = s.collective_exposed[j];
  }
  e.op_start = std::move(s.op_start);
  e.step_seconds = s.seconds;
  e.host_bound_seconds = s.host_bound_seconds;
  const double host = launches.empty() ? 0 : hw.kernel_overhead * static_cast<double>(
      std::count(launches.begin(), launches.end(), true));
  if (host > 0) {
    // Near balance, the host's uneven issue times cost more than the schedule's even ones:
    // the step is at least the smooth maximum of the host's total and the device's own
    // critical path (its schedule with the host infinitely fast). The difference is the device
    // waiting for the host, outside the per-op timeline.
    options.launches.clear();
    options.kernel_overhead = 0;
    const double device = ScheduleStep(stats, op_seconds, collective_seconds, options).seconds;
    const double balanced = HostDeviceSeconds(host, device);
    if (balanced > e.step_seconds) {
      e.host_bound_seconds += balanced - e.step_seconds;
      e.step_seconds = balanced;
    }
  }
  e.exposed_communication_seconds =
      std::max(0.0, e.step_seconds - e.compute_seconds - e.host_bound_seconds);
  // The bounds with the host's issue time: communication all added, or hidden behind the
  // device; the host as in the step.
  e.no_overlap_step_seconds = HostDeviceSeconds(host, e.compute_seconds) + e.communication_seconds;
  e.overlapped_step_seconds = std::max({e.compute_seconds, e.communication_seconds, host});
  return e;
}

}  // namespace spmd::plan
