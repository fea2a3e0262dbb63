// torch_spmd._C: bindings only. Logic lives in csrc/.
#include <torch/csrc/utils/pybind.h>

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <chrono>
#include <map>

#include "bindings.h"

#include "aten/backend.h"
#include "aten/backward_scope.h"
#include "aten/lazy_tensor.h"
#include "aten/recorder.h"
#include "aten/storage_address.h"
#include "aten/debug_text.h"
#include "aten/step_memory.h"
#include "aten/step_program.h"
#include "aten/sync.h"
#include "core/metrics.h"
#include "runtime/compile_cache.h"
#include "runtime/device_data.h"
#include "runtime/device_set.h"
#include "runtime/error_message.h"
#include "runtime/host_block_pool.h"

namespace py = pybind11;

namespace spmd {
namespace {

void BindMetrics(py::module_& m) {
  m.def("_metrics_report", [] { return Metrics::Get().Report(); });
  m.def("_counter_names", [] { return Metrics::Get().CounterNames(); });
  m.def("_counter_value", [](const std::string& name) { return Metrics::Get().CounterValue(name); });
  m.def("_metric_names", [] { return Metrics::Get().MetricNames(); });
  m.def("_metric_data", [](const std::string& name) -> py::object {
    MetricData data;
    if (!Metrics::Get().GetMetric(name, &data)) return py::none();
    return py::make_tuple(data.total_samples, data.accumulator, data.samples);
  });
  m.def("_clear_counters", [] { Metrics::Get().ClearCounters(); });
  m.def("_clear_metrics", [] { Metrics::Get().ClearMetrics(); });
}

void BindDevices(py::module_& m) {
  // The executor's pool of host blocks (runtime/host_block_pool.h).
  m.def("_host_pool_stats", [] {
    runtime::HostPoolStats s = runtime::GetHostPoolStats();
    py::dict d;
    d["bytes_in_use"] = s.bytes_in_use;
    d["bytes_cached"] = s.bytes_cached;
    d["high_water"] = s.high_water;
    d["blocks_reused"] = s.blocks_reused;
    d["blocks_created"] = s.blocks_created;
    return d;
  });
  m.def("_release_cached_host_blocks", &runtime::ReleaseCachedHostBlocks);
  m.def("_num_devices", [] { return runtime::DeviceSet::Get().num_devices(); });
  m.def("_configure_devices", &runtime::DeviceSet::Configure, py::arg("num_devices"),
        py::arg("bytes_per_device"));
  m.def("_parse_bytes", &runtime::DeviceSet::ParseBytes);
  m.def("_memory_info", [](int64_t device) {
    runtime::DeviceStats s = runtime::DeviceSet::Get().Stats(device);
    py::dict d;
    d["bytes_used"] = s.bytes_used;
    d["bytes_limit"] = s.bytes_limit;
    d["peak_bytes_used"] = s.peak_bytes_used;
    d["num_buffers"] = s.num_buffers;
    return d;
  });
  m.def("_host_memory_info", [](int64_t host) {
    runtime::DeviceStats s = runtime::DeviceSet::Get().HostStats(host);
    py::dict d;
    d["bytes_used"] = s.bytes_used;
    d["bytes_limit"] = s.bytes_limit;
    d["peak_bytes_used"] = s.peak_bytes_used;
    d["num_buffers"] = s.num_buffers;
    return d;
  });
  m.def("_num_hosts", [] { return runtime::DeviceSet::Get().num_hosts(); });
  m.def("_reset_peak_memory", [] { runtime::DeviceSet::Get().ResetAllPeaks(); });
}

void BindGraph(py::module_& m) {
  m.def("_init", &aten::RegisterBackend);
  m.def("_num_captured_ops", &aten::NumCapturedOps);
  m.def("_recorded_off_main_thread", &aten::RecordedOffMainThread);
  m.def("_is_spmd_tensor", [](const at::Tensor& t) { return aten::TryGetLazyImpl(t) != nullptr; });
  // `cdata`: a Python storage's `_cdata` (its StorageImpl*), as torch's own bindings take it.
  m.def("_storage_address", [](uintptr_t cdata) {
    return aten::StorageAddress(reinterpret_cast<c10::StorageImpl*>(cdata));
  });
  m.def("_mark_step", [] {
    Count("MarkStep");
    py::gil_scoped_release release;
    aten::SyncAll();
  });
  m.def("_sync_tensors", [](const std::vector<at::Tensor>& tensors) {
    std::vector<aten::SlotPtr> slots;
    for (const at::Tensor& t : tensors) slots.push_back(aten::GetLazyImpl(t)->slot());
    py::gil_scoped_release release;
    aten::SyncSlots(slots);
  });
  m.def("_to_host", [](const at::Tensor& t) {
    at::Tensor host = aten::ToHost(t);
    return host.clone();
  });
  m.def("_graph_text", &aten::PendingGraphText);
  m.def("_pending_graph_parameters", &aten::PendingGraphParameters);
  m.def("_pending_graph_parameter_index", &aten::PendingGraphParameterIndex);
  m.def("_partitioned_program", &aten::PartitionedProgramText);
  m.def("_set_defer_output_reductions", &aten::SetDeferOutputReductions);
  m.def("_defer_output_reductions", &aten::DeferOutputReductions);
  m.def("_set_collective_matmul", &aten::SetWindowedEinsum);
  m.def("_set_context_parallel", &aten::SetContextParallel);
  m.def("_context_parallel", &aten::ContextParallelMethod);
  m.def("_collective_matmul", &aten::WindowedEinsum);
  m.def("_set_fused_memory", &aten::SetFusedMemory);
  m.def("_fused_memory", &aten::FusedMemory);
  m.def("_last_step_stats", [] {
    partition::ProgramStats s = aten::LastStepStats();
    auto to_list = [](const std::vector<partition::CollectiveStat>& stats) {
      py::list out;
      for (const auto& c : stats) {
        py::dict d;
        d["kind"] = c.kind;
        d["axes"] = c.axes;
        d["group_size"] = c.group_size;
        d["bytes"] = c.bytes;
        // Multi-process SPMD: whether its groups put devices of several processes together
        // (it then runs over the process group, runtime/process_span.h).
        d["crosses_processes"] = runtime::GroupsSpanProcesses({c.first_group});
        d["scope"] = c.scope;
        d["position"] = c.position;
        d["input_position"] = c.input_position;
        d["first_use_position"] = c.first_use_position;
        out.append(d);
      }
      return out;
    };
    py::dict d;
    d["collectives"] = to_list(s.collectives);
    d["pending_reductions"] = to_list(s.pending_reductions);
    d["peak_bytes_per_device"] = s.peak_bytes_per_device;
    d["host_peak_bytes_per_device"] = s.host_peak_bytes_per_device;
    d["flops_per_device"] = s.flops_per_device;
    d["model_flops"] = s.model_flops;
    d["recomputed_flops"] = s.recomputed_flops;
    d["peak_op"] = s.peak_op;
    py::list costs;
    for (const auto& c : s.op_costs)
      costs.append(py::make_tuple(c.op, c.flops, c.model_flops, c.bytes, DTypeName(c.dtype),
                                  c.scope, c.position));
    // (op, flops per device, model flops, bytes per device, result dtype, module path,
    //  position in the program)
    d["op_costs"] = costs;
    d["resident_bytes_per_device"] = s.resident_bytes_per_device;
    d["device_peak_bytes"] = s.device_peak_bytes;
    d["reserved_bytes_per_device"] = s.reserved_bytes_per_device;
    d["replicated_fallback_ops"] = s.replicated_fallback_ops;
    return d;
  });
  m.def("_compile_cache_size", [] { return runtime::CompileCache::Get().size(); });
  m.def("_clear_compile_cache", [] { runtime::CompileCache::Get().Clear(); });
  m.def("_live_tensor_count", &aten::LiveSlotCount);
  // The module path new ops are recorded under ("" for none): torch_spmd.debug's tracker. Their
  // backward is recorded under the path's " (backward)" (aten/backward_scope.h).
  m.def("_set_scope", &aten::SetForwardScope);
  m.def("_clear_forward_scopes", &aten::ClearForwardScopes);
  m.def("_scope", [] { return ir::ScopeName(ir::CurrentScope()); });
  // The data every live spmd tensor holds, each once: (global shape, dtype, sharding text,
  // bytes per device, planned, number of tensors pointing at it).
  m.def("_live_data", [] {
    std::map<const ir::DataHandle*, std::pair<const runtime::DeviceData*, int>> seen;
    for (const aten::SlotPtr& s : aten::LiveSlots())
      if (s->value.valid() && s->value.node->is_data()) {
        auto* d = static_cast<const runtime::DeviceData*>(s->value.node->data().get());
        auto& e = seen[d];
        e.first = d;
        ++e.second;
      }
    py::list out;
    for (const auto& [key, e] : seen) {
      const runtime::DeviceData* d = e.first;
      out.append(py::make_tuple(d->type().shape, DTypeName(d->type().dtype),
                                d->sharding().valid() ? d->sharding().ToString() : "",
                                d->BytesPerDevice(), d->planned(), e.second));
    }
    return out;
  });
  // Seconds to call the boxed CPU kernel of aten::add.Tensor on 4x4 floats `n` times: the
  // kernel cost that benchmarks/overhead.py subtracts from per-node replay time.
  m.def("_time_boxed_add", [](int64_t n) {
    auto op = c10::Dispatcher::singleton().findSchemaOrThrow("aten::add", "Tensor");
    at::Tensor a = at::randn({4, 4}), b = at::randn({4, 4});
    auto start = std::chrono::steady_clock::now();
    for (int64_t i = 0; i < n; ++i) {
      std::vector<c10::IValue> stack{a, b, c10::Scalar(1)};
      op.callBoxed(&stack);
    }
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  });
}

}  // namespace
}  // namespace spmd

PYBIND11_MODULE(_C, m) {
  // c10 errors carry a C++ backtrace in what(); users get the message, as with torch's own ops.
  // Local to this module: a global translator would also rewrite the exceptions of torch's own
  // bindings (HashStore.get's DistStoreError would become a plain RuntimeError).
  py::register_local_exception_translator([](std::exception_ptr p) {
    using spmd::runtime::UserMessage;
    try {
      if (p) std::rethrow_exception(p);
    } catch (const c10::ValueError& e) {
      PyErr_SetString(PyExc_ValueError, UserMessage(e));
    } catch (const c10::IndexError& e) {
      PyErr_SetString(PyExc_IndexError, UserMessage(e));
    } catch (const c10::TypeError& e) {
      PyErr_SetString(PyExc_TypeError, UserMessage(e));
    } catch (const c10::NotImplementedError& e) {
      PyErr_SetString(PyExc_NotImplementedError, UserMessage(e));
    } catch (const c10::Error& e) {
      PyErr_SetString(PyExc_RuntimeError, UserMessage(e));
    }
  });
  // The graph lock lets go of the GIL while it waits (aten/lazy_tensor.h: GraphLock).
  spmd::aten::SetGilHooks(
      []() -> void* {
        if (!Py_IsInitialized() || !PyGILState_Check()) return nullptr;
        return PyEval_SaveThread();
      },
      [](void* state) { PyEval_RestoreThread(static_cast<PyThreadState*>(state)); });
  spmd::BindMetrics(m);
  spmd::BindDevices(m);
  spmd::BindGraph(m);
  spmd::BindSharding(m);
  spmd::BindCollectives(m);
  spmd::BindReplica(m);
  spmd::BindPlan(m);
  spmd::BindGraphTemplates(m);
}
