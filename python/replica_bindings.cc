// Bindings for multi-process mode: recording the xm:: collectives, and installing the
// torch.distributed process groups they run over.
//
// The process groups cross from Python to C++ as c10d::ProcessGroup objects: torch registers
// the Python ProcessGroup type with pybind11 (holder c10::intrusive_ptr), and this module
// shares pybind11's internals with torch, so the cast yields torch's own C++ object. The
// collectives then run entirely in C++ (no GIL, no Python callbacks) inside the graph's
// execution.
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include "aten/replace_data.h"
#include "aten/replica_api.h"
#include "bindings.h"
#include "runtime/collectives.h"
#include "runtime/process_group_collectives.h"
#include "runtime/process_span.h"
#include "runtime/world_health.h"

namespace py = pybind11;

namespace spmd {

namespace {

using ProcessGroupPtr = c10::intrusive_ptr<c10d::ProcessGroup>;

ReduceOp ToReduceOp(int64_t op) {
  if (op < 0 || op > static_cast<int64_t>(ReduceOp::kMin))
    throw std::invalid_argument("reduce op must be 0 (sum), 1 (max) or 2 (min), got " +
                                std::to_string(op));
  return static_cast<ReduceOp>(op);
}

ProcessGroupPtr ToProcessGroup(const py::object& pg) {
  try {
    return pg.cast<ProcessGroupPtr>();
  } catch (const py::cast_error&) {
    throw std::invalid_argument("expected a torch.distributed ProcessGroup, got " +
                                py::repr(pg).cast<std::string>());
  }
}

std::shared_ptr<runtime::ProcessGroupCollectives> CurrentProcessGroupCollectives() {
  auto pgc = std::dynamic_pointer_cast<runtime::ProcessGroupCollectives>(
      runtime::Collectives::Replicas());
  if (!pgc) throw std::runtime_error("no process group collectives are installed");
  return pgc;
}

}  // namespace

void BindReplica(py::module_& m) {
  m.def(
      "_xm_all_reduce",
      [](const std::vector<at::Tensor>& inputs, int64_t op, double scale,
         const aten::ReplicaGroups& groups) {
        return aten::ReplicaAllReduce(inputs, ToReduceOp(op), scale, groups);
      },
      py::arg("inputs"), py::arg("op"), py::arg("scale"), py::arg("groups"));
  m.def("_xm_all_gather", &aten::ReplicaAllGather, py::arg("input"), py::arg("dim"),
        py::arg("groups"));
  m.def(
      "_xm_reduce_scatter",
      [](const at::Tensor& t, int64_t op, double scale, int64_t dim,
         const aten::ReplicaGroups& groups) {
        return aten::ReplicaReduceScatter(t, ToReduceOp(op), scale, dim, groups);
      },
      py::arg("input"), py::arg("op"), py::arg("scale"), py::arg("dim"), py::arg("groups"));
  m.def("_xm_all_to_all", &aten::ReplicaAllToAll, py::arg("input"), py::arg("split_dim"),
        py::arg("concat_dim"), py::arg("groups"));
  m.def("_xm_assign", &aten::AssignValue, py::arg("dst"), py::arg("src"));
  m.def("_replace_data", &aten::ReplaceData, py::arg("dst"), py::arg("src"),
        "`dst.data = src` for spmd tensors (shape and dtype may change; no version bump).");

  m.def(
      "_install_process_group_collectives",
      [](const py::object& world) {
        runtime::Collectives::SetReplicas(
            std::make_shared<runtime::ProcessGroupCollectives>(ToProcessGroup(world)));
      },
      py::arg("world"),
      "Runs the xm cross-replica collectives over `world` (a torch.distributed ProcessGroup "
      "spanning all processes; replica = rank) from now on.");
  m.def(
      "_add_process_subgroup",
      [](const std::vector<int64_t>& ranks, const py::object& pg) {
        CurrentProcessGroupCollectives()->AddGroup(ranks, ToProcessGroup(pg));
      },
      py::arg("ranks"), py::arg("group"));
  m.def(
      "_has_process_subgroup",
      [](const std::vector<int64_t>& ranks) {
        return CurrentProcessGroupCollectives()->HasGroup(ranks);
      },
      py::arg("ranks"));
  m.def("_reset_collectives", [] { runtime::Collectives::SetReplicas(nullptr); },
        "Drops the process groups: the xm collectives fall back to the in-process ones.");
  m.def("_collectives_name", [] { return runtime::Collectives::Replicas()->name(); });
  m.def(
      "_install_process_span",
      [](const py::object& world, int64_t local_devices) {
        runtime::ProcessSpan::Set(
            runtime::MakeProcessGroupSpan(ToProcessGroup(world), local_devices));
      },
      py::arg("world"), py::arg("local_devices"),
      "Multi-process SPMD: this process (rank of `world`) owns `local_devices` of the global "
      "devices (runtime/process_span.h).");
  m.def("_clear_process_span", [] { runtime::ProcessSpan::Set(nullptr); });
  m.def(
      "_start_world_health",
      [](const py::object& store, int rank, int count, double heartbeat_seconds) {
        c10::intrusive_ptr<c10d::Store> s;
        try {
          s = store.cast<c10::intrusive_ptr<c10d::Store>>();
        } catch (const py::cast_error&) {
          throw std::invalid_argument("expected a torch.distributed Store, got " +
                                      py::repr(store).cast<std::string>());
        }
        if (!(heartbeat_seconds > 0))
          throw std::invalid_argument("the heartbeat interval must be > 0 seconds, got " +
                                      std::to_string(heartbeat_seconds));
        runtime::WorldHealth::Start(std::move(s), rank, count, heartbeat_seconds);
      },
      py::arg("store"), py::arg("rank"), py::arg("count"), py::arg("heartbeat_seconds"),
      "Multi-process SPMD: watches the world's processes over `store` and aborts every "
      "exchange when one fails or falls silent (runtime/world_health.h).");
  m.def("_stop_world_health", [] {
    py::gil_scoped_release release;
    runtime::WorldHealth::Stop();
  });
  m.def("_world_aborted", [] { return runtime::WorldHealth::Aborted(); });
  m.def("_process_span", []() -> py::object {
    auto span = runtime::ProcessSpan::Current();
    if (!span) return py::none();
    return py::make_tuple(span->process_index(), span->process_count(), span->local_devices());
  });
  m.def("_global_num_devices", &runtime::GlobalDeviceCount);
}

}  // namespace spmd
