// Replay of compiled regions (aten/graph_template.h): torch_spmd/_torch_patches/dynamo.py's backends
// capture a compiled graph's first run and instantiate it on later calls.
#include "bindings.h"

#include <torch/csrc/autograd/graph_task.h>

#include "aten/graph_template.h"

namespace spmd {

namespace py = pybind11;

namespace {

// Values kept from one instantiation for another (GraphTemplate::Values), opaque to Python.
struct KeptValues {
  aten::GraphTemplate::Values values;
};

// instantiate_keeping's references (which outputs to return, which values to keep), converted
// from Python once per template: a forward keeps ~100 activations, and converting their list
// at every call cost as much as instantiating a tenth of the template.
struct KeepingRefs {
  std::vector<int> returned;
  std::vector<std::pair<aten::GraphTemplate::KeptFrom, int>> kept;
};

}  // namespace

void BindGraphTemplates(py::module_& m) {
  py::class_<KeptValues>(m, "_KeptValues")
      .def(py::init([](const std::vector<at::Tensor>& tensors) {
             std::lock_guard<aten::GraphLock> lock(aten::GraphMutex());
             KeptValues kept;
             for (const at::Tensor& t : tensors)
               kept.values.push_back(aten::GetLazyImpl(t, "a kept value")->slot()->value);
             return kept;
           }), "The current values of spmd tensors.")
      .def("tensors", [](const KeptValues& kept) {
             std::lock_guard<aten::GraphLock> lock(aten::GraphMutex());
             std::vector<at::Tensor> out;
             for (const ir::Value& v : kept.values) out.push_back(aten::MakeFunctionalLazyTensor(v));
             return out;
           }, "The values as spmd tensors.")
      .def("__len__", [](const KeptValues& kept) { return kept.values.size(); });
  // Whether the backward pass running on this thread keeps its graph (retain_graph=True):
  // a lean backward then keeps the forward's values for the next one, else drops them.
  m.def("_graph_task_keeps_graph", &torch::autograd::get_current_graph_task_keep_graph);
  py::class_<KeepingRefs>(m, "_KeepingRefs")
      .def(py::init([](std::vector<int> returned, const std::vector<std::pair<int, int>>& kept) {
             KeepingRefs refs{std::move(returned), {}};
             for (const auto& [from, i] : kept)
               refs.kept.emplace_back(static_cast<aten::GraphTemplate::KeptFrom>(from), i);
             return refs;
           }), "(the outputs to return (indices), the values to keep ((0, output) or "
               "(1, input) pairs)), for instantiate_keeping.");
  py::class_<aten::GraphTemplate, std::shared_ptr<aten::GraphTemplate>>(m, "_GraphTemplate")
      .def("instantiate", &aten::GraphTemplate::Instantiate,
           "The region's outputs from these inputs; None when they do not match the capture's.")
      .def("instantiate_keeping",
           [](const aten::GraphTemplate& tmpl, const std::vector<at::Tensor>& inputs,
              const KeepingRefs& refs) -> py::object {
             auto made = tmpl.InstantiateKeeping(inputs, refs.returned, refs.kept);
             if (!made) return py::none();
             return py::make_tuple(made->first, KeptValues{std::move(made->second)});
           },
           "(the outputs the _KeepingRefs return, the values they keep as _KeptValues), or "
           "None as instantiate.")
      .def("instantiate_after",
           [](const aten::GraphTemplate& tmpl, const KeptValues& kept,
              const std::vector<at::Tensor>& inputs) {
             return tmpl.InstantiateAfter(kept.values, inputs);
           },
           "instantiate with the kept values as the first inputs.")
      .def_property_readonly("num_nodes", &aten::GraphTemplate::num_nodes)
      .def_property_readonly("num_outputs", &aten::GraphTemplate::num_outputs);
  py::class_<aten::TemplateCapture>(m, "_TemplateCapture")
      .def(py::init<std::vector<at::Tensor>>())
      .def("finish", [](aten::TemplateCapture& capture, const std::vector<at::Tensor>& outputs) {
        std::string why_not;
        std::shared_ptr<aten::GraphTemplate> tmpl = capture.Finish(outputs, &why_not);
        return py::make_tuple(tmpl ? py::cast(tmpl) : py::none(), why_not);
      }, "(template, '') or (None, why the region cannot be replayed).");
}

}  // namespace spmd
