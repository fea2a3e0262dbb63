// Replay of compiled regions (aten/graph_template.h): torch_spmd/_dynamo_support.py's backends
// capture a compiled graph's first run and instantiate it on later calls.
#include "bindings.h"

#include "aten/graph_template.h"

namespace spmd {

namespace py = pybind11;

void BindGraphTemplates(py::module_& m) {
  py::class_<aten::GraphTemplate, std::shared_ptr<aten::GraphTemplate>>(m, "_GraphTemplate")
      .def("instantiate", &aten::GraphTemplate::Instantiate,
           "The region's outputs from these inputs; None when they do not match the capture's.")
      .def_property_readonly("num_nodes", &aten::GraphTemplate::num_nodes);
  py::class_<aten::TemplateCapture>(m, "_TemplateCapture")
      .def(py::init<std::vector<at::Tensor>>())
      .def("finish", [](aten::TemplateCapture& capture, const std::vector<at::Tensor>& outputs) {
        std::string why_not;
        std::shared_ptr<aten::GraphTemplate> tmpl = capture.Finish(outputs, &why_not);
        return py::make_tuple(tmpl ? py::cast(tmpl) : py::none(), why_not);
      }, "(template, '') or (None, why the region cannot be replayed).");
}

}  // namespace spmd
