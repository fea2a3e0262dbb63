// Plan mode and the step-time model: switching planning on and off, and estimating the last
// step on a hardware description.
#include "bindings.h"

#include <algorithm>

#include "aten/auto_sharding.h"
#include "aten/layout_search.h"
#include "aten/debug_text.h"
#include "aten/step_memory.h"
#include "aten/sync.h"
#include "partition/cost.h"
#include "plan/cost_model.h"
#include "runtime/executable.h"
#include "runtime/plan_mode.h"

namespace spmd {

namespace py = pybind11;

namespace {

// The numbers of `d` (torch_spmd/_hardware.py's fields). A TPU preset names its domain a
// slice (devices_per_slice, dcn_bandwidth), a GPU one a host (devices_per_host,
// cross_host_bandwidth): the same two fields of Hardware.
plan::Hardware HardwareFromDict(const py::dict& d) {
  plan::Hardware hw;
  hw.name = d.contains("name") ? d["name"].cast<std::string>() : "custom";
  auto num = [&](const char* key, double fallback = 0) {
    return d.contains(key) ? d[key].cast<double>() : fallback;
  };
  auto either = [&](const char* a, const char* b, double fallback) {
    if (d.contains(a) && d.contains(b))
      throw py::value_error("hardware '" + hw.name + "' gives both " + a + " and " + b +
                            "; they are the same field (a host's or a slice's)");
    return num(a, num(b, fallback));
  };
  hw.peak_flops_bf16 = num("peak_flops_bf16");
  hw.peak_flops_fp32 = num("peak_flops_fp32", hw.peak_flops_bf16);
  hw.peak_flops_fp8 = num("peak_flops_fp8", 0);
  hw.matmul_efficiency = num("matmul_efficiency", 1);
  hw.matmul_tile = static_cast<int64_t>(num("matmul_tile"));
  hw.matrix_units = static_cast<int64_t>(num("matrix_units"));
  hw.hbm_bytes = num("hbm_bytes");
  hw.hbm_bandwidth = num("hbm_bandwidth");
  hw.hbm_efficiency = num("hbm_efficiency", 1);
  hw.kernel_overhead = num("kernel_overhead");
  hw.ring_bandwidth = num("ring_bandwidth");
  hw.devices_per_domain = static_cast<int64_t>(either("devices_per_host", "devices_per_slice", 0));
  hw.cross_domain_bandwidth = either("cross_host_bandwidth", "dcn_bandwidth", hw.ring_bandwidth);
  hw.torus_dims = static_cast<int>(num("torus_dims"));
  hw.link_latency = num("link_latency");
  hw.host_bandwidth = num("host_bandwidth", hw.host_bandwidth);
  hw.host_memory_bytes = num("host_memory_bytes");
  hw.host_devices = static_cast<int64_t>(num("host_devices", 1));
  if (!(hw.host_bandwidth > 0) || hw.host_devices < 1)
    throw py::value_error("hardware '" + hw.name +
                          "': host_bandwidth must be positive and host_devices >= 1");
  hw.all_gather_prefetch = static_cast<int64_t>(num("all_gather_prefetch"));
  if (d.contains("overlap_grad_reduce")) {
    const py::handle v = d["overlap_grad_reduce"];
    if (!py::isinstance<py::bool_>(v))
      throw py::value_error("hardware '" + hw.name + "': overlap_grad_reduce must be True or "
                            "False, got " + py::repr(v).cast<std::string>());
    hw.overlap_grad_reduce = v.cast<bool>();
  }
  if (hw.peak_flops_bf16 <= 0 || hw.peak_flops_fp32 <= 0 || hw.hbm_bandwidth <= 0 ||
      hw.ring_bandwidth <= 0 || hw.cross_domain_bandwidth <= 0)
    throw py::value_error("hardware '" + hw.name +
                          "' needs positive peak_flops_bf16, hbm_bandwidth and ring_bandwidth");
  if (!(hw.kernel_overhead >= 0))
    throw py::value_error("hardware '" + hw.name + "': kernel_overhead must be >= 0 seconds");
  if (!(hw.matmul_efficiency > 0 && hw.matmul_efficiency <= 1) ||
      !(hw.hbm_efficiency > 0 && hw.hbm_efficiency <= 1))
    throw py::value_error("hardware '" + hw.name +
                          "': matmul_efficiency and hbm_efficiency are fractions in (0, 1]");
  return hw;
}

}  // namespace

void BindPlan(py::module_& m) {
  m.def("_set_planning", [](bool on, const std::string& name) { runtime::SetPlanning(on, name); },
        py::arg("on"), py::arg("name") = "");
  m.def("_planning", [] { return runtime::Planning(); });
  // For the auto-sharding search (torch_spmd/plan/auto_shard.py): which dims of the step's
  // inputs the rules tie together.
  m.def("_data_id", &aten::DataId);
  // xr.use_spmd(auto=True): the unannotated parameters of every step get layouts the cost
  // model chooses on `hardware` (aten/auto_sharding.h).
  m.def("_set_auto_sharding", [](bool on, const py::dict& hardware) {
    aten::SetAutoSharding(on, on ? HardwareFromDict(hardware) : plan::Hardware{});
  });
  m.def("_auto_sharding", &aten::AutoSharding);
  m.def("_get_graph_hash", [](const std::vector<at::Tensor>& tensors) {
    return static_cast<uint64_t>(aten::PendingGraphHash(tensors));
  });
  m.def("_pending_dim_classes", &aten::PendingDimClasses);
  // The layout ILP's coefficients of the pending step on a mesh of `mesh_shape`
  // (plan/layout_costs.h): options[decision] lists (dim, axis indices) pairs.
  m.def("_pending_layout_costs",
        [](const std::vector<int64_t>& mesh_shape, const std::vector<int>& decision_of_class,
           const std::vector<std::vector<std::pair<int, std::vector<int>>>>& options,
           const std::unordered_map<int64_t, int>& storage_of_data, const py::dict& hardware,
           int memory_points) {
          plan::LayoutProblem p;
          p.decision_of_class = decision_of_class;
          p.memory_points = memory_points;
          for (const auto& decision : options) {
            auto& opts = p.options.emplace_back();
            for (const auto& [dim, axes] : decision) opts.push_back({dim, axes});
          }
          const plan::LayoutCosts c = aten::PendingLayoutCosts(
              mesh_shape, std::move(p), storage_of_data, HardwareFromDict(hardware));
          py::list tuples;
          for (const plan::DecisionTuple& t : c.tuples)
            tuples.append(py::make_tuple(t.decisions, t.combos, t.seconds, t.bytes));
          py::dict d;
          d["tuples"] = tuples;
          d["fixed_seconds"] = c.fixed_seconds;
          d["fixed_bytes"] = c.fixed_bytes;
          d["row_positions"] = c.row_positions;
          return d;
        });
  // Per-device bytes over the last step's program (one entry per program node), and the values
  // live at its peak: (bytes, op, scope, defined at, last use), largest first.
  m.def("_last_memory_timeline", [] {
    py::dict d;
    std::shared_ptr<const partition::Program> program = aten::LastProgram();
    if (!program) return d;
    std::vector<bool> donated = aten::LastDonated();
    std::vector<int64_t> live = partition::LiveBytesTimeline(*program, &donated);
    int64_t peak_at = 0;
    for (size_t i = 0; i < live.size(); ++i)
      if (live[i] > live[peak_at]) peak_at = static_cast<int64_t>(i);
    py::list ops, scopes, buffers;
    for (const ir::NodePtr& n : program->nodes) {
      ops.append(n->op()->qualified);
      scopes.append(ir::ScopeName(n->scope()));
    }
    std::vector<partition::LiveValue> values = partition::ValueLifetimes(*program, &donated);
    std::sort(values.begin(), values.end(),
              [](const auto& a, const auto& b) { return a.bytes > b.bytes; });
    for (const partition::LiveValue& v : values)
      if (v.defined_at <= peak_at && v.last_use >= peak_at)
        buffers.append(py::make_tuple(v.bytes, v.node->op()->qualified,
                                      ir::ScopeName(v.node->scope()), v.defined_at, v.last_use));
    d["live_bytes"] = live;
    d["ops"] = ops;
    d["scopes"] = scopes;
    d["peak_index"] = peak_at;
    d["peak_buffers"] = buffers;
    return d;
  });
  // What the emulator measured for the last step when it was executed (empty when planned):
  // per instruction, its node's op, module path and seconds per device.
  m.def("_last_run_profile", [] {
    py::list out;
    std::shared_ptr<const partition::Program> program = aten::LastProgram();
    runtime::RunProfile profile = runtime::LastRunProfile();
    if (!program || profile.program != program.get()) return out;
    for (size_t i = 0; i < profile.seconds.size(); ++i) {
      const ir::Node& n = *program->nodes.at(profile.node_index[i]);
      out.append(py::make_tuple(n.op()->qualified, ir::ScopeName(n.scope()), n.op()->internal,
                                profile.seconds[i]));
    }
    return out;
  });
  // The last step (planned or executed) on `hardware` (a dict of Hardware's fields).
  // The last step's predicted step seconds and peak bytes per device (what Plan.report() says
  // of them) without the rest of the report: the auto-sharding search's evaluations.
  m.def("_last_step_summary", [](const py::dict& hardware) {
    partition::ProgramStats stats = aten::LastStepStats();
    return py::make_tuple(plan::EstimateStep(stats, HardwareFromDict(hardware)).step_seconds,
                          stats.device_peak_bytes);
  });
  m.def("_estimate_last_step", [](const py::dict& hardware) {
    plan::Hardware hw = HardwareFromDict(hardware);
    partition::ProgramStats stats = aten::LastStepStats();
    plan::StepEstimate e = plan::EstimateStep(stats, hw);
    py::dict d;
    d["compute_seconds"] = e.compute_seconds;
    d["compute_bound_seconds"] = e.compute_bound_seconds;
    d["memory_bound_seconds"] = e.memory_bound_seconds;
    d["host_bound_seconds"] = e.host_bound_seconds;
    d["communication_seconds"] = e.communication_seconds;
    d["host_transfer_seconds"] = e.host_transfer_seconds;
    d["step_seconds"] = e.step_seconds;
    d["exposed_communication_seconds"] = e.exposed_communication_seconds;
    d["no_overlap_step_seconds"] = e.no_overlap_step_seconds;
    d["overlapped_step_seconds"] = e.overlapped_step_seconds;
    py::list op_seconds;
    for (const plan::OpTime& t : e.op_times) op_seconds.append(t.seconds());
    d["op_seconds"] = op_seconds;
    d["op_start"] = e.op_start;
    py::list coll;  // per collective of the program
    for (const plan::CollectiveTime& c : e.collective_seconds) {
      py::dict one;
      one["seconds"] = c.seconds;
      one["crosses_hosts"] = c.crosses_hosts;
      one["algorithm"] = c.algorithm;
      one["start"] = c.start;
      one["exposed_seconds"] = c.exposed_seconds;
      coll.append(one);
    }
    d["collective_seconds"] = coll;
    return d;
  });
}

}  // namespace spmd
