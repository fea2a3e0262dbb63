// Bindings that run the runtime's collectives directly on per-device buffers (for tests).
#include "bindings.h"

#include <set>

#include "core/error.h"
#include "ir/internal_ops.h"
#include "runtime/internal_kernels.h"

namespace py = pybind11;

namespace spmd {

namespace {

// `pairs` may be given flat [s0, d0, s1, d1, ...] or as [(s0, d0), (s1, d1), ...].
std::vector<int64_t> FlatInts(const py::handle& value) {
  std::vector<int64_t> flat;
  for (const py::handle& item : value) {
    if (py::isinstance<py::int_>(item)) flat.push_back(item.cast<int64_t>());
    else for (const py::handle& v : item) flat.push_back(v.cast<int64_t>());
  }
  return flat;
}

int64_t ReduceOpValue(const py::handle& value) {
  if (!py::isinstance<py::str>(value)) return value.cast<int64_t>();
  const std::string name = value.cast<std::string>();
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kMin})
    if (ReduceOpName(op) == name) return static_cast<int64_t>(op);
  throw std::invalid_argument("unknown reduce op " + name);
}

// The op's non-tensor args in schema order, from `axes` and the `attrs` dict; every key of
// `attrs` must be an attribute of the op, so a misspelt one fails instead of being ignored.
std::vector<ir::Arg> ArgsFor(const ir::OpInfo& op, const std::vector<int64_t>& axes,
                             const py::dict& attrs) {
  std::vector<ir::Arg> args;
  std::set<std::string> used;
  for (const ir::ArgSchema& schema : op.args) {
    const std::string& name = schema.name;
    if (schema.type == ir::ArgType::kTensor) {
      args.push_back(ir::Arg::Tensor(0));
    } else if (name == "axes") {
      args.push_back(ir::Arg::IntList(axes));
    } else {
      SPMD_CHECK_VALUE(attrs.contains(name), op.qualified, " needs the attribute '", name, "'");
      used.insert(name);
      py::handle value = attrs[py::str(name)];
      if (name == "op") args.push_back(ir::Arg::Int(ReduceOpValue(value)));
      else if (schema.type == ir::ArgType::kInt) args.push_back(ir::Arg::Int(value.cast<int64_t>()));
      else if (schema.type == ir::ArgType::kIntList) args.push_back(ir::Arg::IntList(FlatInts(value)));
      else args.push_back(ir::Arg::Double(value.cast<double>()));
    }
  }
  for (const auto& item : attrs) {
    const std::string key = item.first.cast<std::string>();
    SPMD_CHECK_VALUE(used.count(key), op.qualified, " has no attribute '", key, "'");
  }
  return args;
}

}  // namespace

void BindCollectives(py::module_& m) {
  m.def(
      "_run_collective",
      [](const std::string& kind, const std::vector<at::Tensor>& inputs,
         const std::vector<int64_t>& device_ids, const std::vector<int64_t>& mesh_shape,
         const std::vector<int64_t>& axes, const py::dict& attrs, bool stacked) {
        const ir::OpInfo* op = ir::FindOp("spmd::" + kind);
        SPMD_CHECK_VALUE(op != nullptr && op->internal, "unknown spmd op ", kind);
        const int64_t n = runtime::DeviceSet::Get().num_devices();
        SPMD_CHECK_VALUE(static_cast<int64_t>(inputs.size()) == n, "expected one input per device (",
                         n, "), got ", inputs.size());
        std::vector<ir::Arg> args = ArgsFor(*op, axes, attrs);
        auto mesh = std::make_shared<const Mesh>(device_ids, mesh_shape);
        runtime::PerDevice buffers;
        for (int64_t d = 0; d < n; ++d)
          buffers.push_back(runtime::MakeBuffer(d, inputs[d], "collective test input"));
        runtime::PerDevice out = runtime::RunSpmdOp(*op, std::move(args), mesh, buffers, stacked);
        std::vector<at::Tensor> result;
        for (const runtime::BufferPtr& b : out) result.push_back(b->tensor);
        return result;
      },
      py::arg("kind"), py::arg("inputs"), py::arg("device_ids"), py::arg("mesh_shape"),
      py::arg("axes"), py::arg("attrs") = py::dict(), py::arg("stacked") = false,
      "Runs spmd::<kind> (e.g. 'all_gather') on one input per device over the mesh; attrs are "
      "the op's other attributes by name (op: 'sum'|'max'|'min'; pairs: [(src, dst), ...]). "
      "Returns one tensor per device; devices holding identical results share one tensor. "
      "stacked=True runs the device-batched kernel (all devices' shards as one tensor) the "
      "executor uses.");
}

}  // namespace spmd
