#include "aten/eager_fallback.h"

#include <ATen/ATen.h>

#include "aten/graph_template.h"
#include "aten/recorder.h"
#include "aten/sync.h"
#include "core/metrics.h"
#include "runtime/device_data.h"

namespace spmd::aten {

namespace {

// A meta kernel written in Python (torch/_meta_registrations.py) that raises leaves the Python
// error indicator set when it reaches us as a C++ exception (torch's python_error). Python
// bindings restore it when they rethrow; when we handle the failure (by running the op eagerly)
// it must be cleared, or the interpreter reports "returned a result with an exception set".
// Declared weakly: the recorder does not depend on Python being there.
extern "C" {
int Py_IsInitialized(void) __attribute__((weak));
int PyGILState_Ensure(void) __attribute__((weak));  // PyGILState_STATE is an int-sized enum
void PyGILState_Release(int) __attribute__((weak));
void PyErr_Clear(void) __attribute__((weak));
}

}  // namespace

void ClearPendingPythonError(const std::exception& e) {
  if (dynamic_cast<const c10::Error*>(&e)) return;  // a C++ kernel's error: nothing pending
  if (!Py_IsInitialized || !PyGILState_Ensure || !PyGILState_Release || !PyErr_Clear) return;
  if (!Py_IsInitialized()) return;
  int state = PyGILState_Ensure();
  PyErr_Clear();
  PyGILState_Release(state);
}

std::vector<c10::IValue> HostArguments(const OpPlan& plan, c10::ArrayRef<c10::IValue> args,
                                       std::vector<LazyImpl*>* impls, bool* any_lazy) {
  const size_t num_args = plan.info->args.size();
  std::vector<c10::IValue> host(args.begin(), args.end());
  if (impls) impls->assign(num_args, nullptr);
  if (any_lazy) *any_lazy = false;
  auto to_host = [&](const at::Tensor& t, bool written, LazyImpl** impl_out) -> at::Tensor {
    LazyImpl* impl = TryGetLazyImpl(t);
    if (!impl) return t;
    if (any_lazy) *any_lazy = true;
    if (impl_out) *impl_out = impl;
    at::Tensor h = Materialize(impl->slot())->ToHost();
    return written ? h.clone() : h;  // device buffers are immutable
  };
  for (size_t i = 0; i < num_args; ++i) {
    c10::IValue& v = host[i];
    const ir::ArgSchema& schema = plan.info->args[i];
    if (v.isTensor()) {
      v = to_host(v.toTensor(), schema.is_write, impls ? &(*impls)[i] : nullptr);
    } else if (v.isTensorList()) {
      c10::List<at::Tensor> list;
      for (at::Tensor t : v.toTensorList()) list.push_back(to_host(t, schema.is_write, nullptr));
      v = list;
    } else if (schema.type == ir::ArgType::kOptionalTensorList && v.isList()) {
      c10::List<c10::optional<at::Tensor>> list;
      for (const c10::IValue& e : v.toListRef())
        list.push_back(e.isNone() ? c10::optional<at::Tensor>()
                                  : to_host(e.toTensor(), schema.is_write, nullptr));
      v = list;
    } else if (schema.type == ir::ArgType::kDevice) {
      v = c10::IValue(c10::Device(c10::kCPU));
    }
  }
  return host;
}

void RunEager(OpPlan& plan, torch::jit::Stack* stack) {
  NoteHostWork();
  Count("EagerFallback");
  Count(plan.info->qualified);
  size_t num_args = plan.info->args.size();
  auto args = torch::jit::last(*stack, num_args);
  std::vector<LazyImpl*> impls;
  bool any_lazy = false;
  std::vector<c10::IValue> host = HostArguments(plan, args, &impls, &any_lazy);
  plan.handle->callBoxed(&host);
  torch::jit::drop(*stack, num_args);
  for (size_t r = 0; r < host.size(); ++r) {
    c10::IValue& v = host[r];
    int alias = r < plan.return_alias.size() ? plan.return_alias[r] : -1;
    if (v.isTensor() && v.toTensor().defined() && v.toTensor().device().is_cpu()) {
      if (alias >= 0 && impls[alias]) {
        SetSlotValue(impls[alias]->slot(), UploadValue(v.toTensor()));
        stack->push_back(args[alias]);
      } else {
        stack->push_back(WrapOutput(UploadValue(v.toTensor()), !any_lazy));
      }
    } else if (v.isTensorList()) {
      c10::List<at::Tensor> list;
      for (at::Tensor t : v.toTensorList()) list.push_back(WrapOutput(UploadValue(t), !any_lazy));
      stack->push_back(list);
    } else {
      stack->push_back(std::move(v));
    }
  }
}

void AnswerFromMetadata(OpPlan& plan, torch::jit::Stack* stack) {
  // Ops such as is_same_size (called by autograd for every explicit grad_output) only read
  // sizes/dtypes: answering them eagerly would materialize (sync) their inputs for nothing.
  size_t num_args = plan.info->args.size();
  auto args = torch::jit::last(*stack, num_args);
  std::vector<c10::IValue> meta(args.begin(), args.end());
  auto to_meta = [](const at::Tensor& t) -> at::Tensor {
    if (!t.defined()) return t;
    if (LazyImpl* impl = TryGetLazyImpl(t)) {
      const TensorType& type = impl->slot()->value.type();
      return at::empty(type.shape, at::TensorOptions()
                                       .dtype(runtime::ToScalarType(type.dtype))
                                       .device(c10::kMeta));
    }
    return at::empty_strided(t.sizes(), t.strides(), t.options().device(c10::kMeta));
  };
  for (c10::IValue& v : meta) {
    if (v.isTensor()) v = to_meta(v.toTensor());
  }
  plan.handle->callBoxed(&meta);
  torch::jit::drop(*stack, num_args);
  for (c10::IValue& v : meta) stack->push_back(std::move(v));
}

}  // namespace spmd::aten
