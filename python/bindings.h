// Each binding file adds one group of functions to torch_spmd._C.
#pragma once
#include <torch/csrc/utils/pybind.h>

namespace spmd {
void BindSharding(pybind11::module_& m);
void BindCollectives(pybind11::module_& m);
void BindReplica(pybind11::module_& m);
void BindPlan(pybind11::module_& m);
void BindGraphTemplates(pybind11::module_& m);
}  // namespace spmd
