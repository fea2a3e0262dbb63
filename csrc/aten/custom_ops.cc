// Custom ops (torch.library) whose kernel is CompositeExplicitAutograd run *above*
// functionalization on the device.
//
// Such a kernel (a Python function calling ATen ops: Hugging Face's grouped_mm fallback, which
// torch < 2.8 takes for Mixtral's experts) is reached through functionalization's fallback,
// which unwraps the arguments and excludes functionalization while the kernel runs. The
// kernel's ops then act on the device's inner tensors, where a view is a copy: an in-place
// write into one (`torch.mm(a, b, out=output[start:end])`) never reaches its base, and the
// numbers come out silently wrong. On CPU and CUDA the view shares memory, so it works there.
// We give each such op a PrivateUse1 kernel that wraps the arguments for functionalization
// again, turns it back on, runs the composite kernel, and unwraps the results: its views and
// in-place writes are functionalized like the user's own code.
//
// Custom ops are registered when their library loads, often after torch_spmd: a registration
// listener notes new ops, and the kernels are added before the next op is recorded (not from
// inside the listener, which runs under the dispatcher's lock).
#include <ATen/FunctionalTensorWrapper.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/library.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <vector>

#include "aten/backend.h"
#include "aten/lazy_tensor.h"

namespace spmd::aten {

namespace {

std::mutex g_mu;
std::atomic<bool> g_pending{false};

std::vector<c10::OperatorName>& Pending() {
  static auto* ops = new std::vector<c10::OperatorName>();
  return *ops;
}

// Torch's own libraries: their composite kernels are device-generic C++ (collectives,
// primitives, profiler marks) that must see the device's tensors as they are.
bool TorchsOwn(const std::string& ns) {
  static const char* const kTorch[] = {"aten", "prim", "prims", "profiler", "inductor",
                                       "symm_mem", "rngprims", "debug_mode_ops", "c10d",
                                       "quantized", "mkldnn", "onednn", "fbgemm", "sparse"};
  if (ns.empty() || ns[0] == '_') return true;  // _c10d_functional, _dtensor, _test, ...
  for (const char* t : kTorch)
    if (ns == t) return true;
  return false;
}

class NewOps final : public c10::OpRegistrationListener {
 public:
  void onOperatorRegistered(const c10::OperatorHandle& op) override {
    const std::string& name = op.operator_name().name;
    if (TorchsOwn(name.substr(0, name.find("::")))) return;
    std::lock_guard<std::mutex> lock(g_mu);
    Pending().push_back(op.operator_name());
    g_pending.store(true, std::memory_order_release);
  }
  void onOperatorDeregistered(const c10::OperatorHandle&) override {}
};

// `v` with `fn` applied to its tensors (a tensor or a list of them; anything else as it is).
template <typename Fn>
c10::IValue MapTensors(const c10::IValue& v, Fn fn) {
  if (v.isTensor()) return fn(v.toTensor());
  if (!v.isTensorList()) return v;
  c10::List<at::Tensor> out;
  for (const at::Tensor& t : v.toTensorList()) out.push_back(fn(t));
  return out;
}

at::Tensor Wrapped(const at::Tensor& t) {
  return t.defined() && TryGetLazyImpl(t) && !at::functionalization::impl::isFunctionalTensor(t)
             ? at::functionalization::impl::to_functional_tensor(t)
             : t;
}

at::Tensor Unwrapped(at::Tensor t) {
  if (!t.defined() || !at::functionalization::impl::isFunctionalTensor(t)) return t;
  at::functionalization::impl::sync(t);
  return at::functionalization::impl::from_functional_tensor(t);
}

void RunFunctionalized(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const size_t num_args = op.schema().arguments().size();
  const size_t first = stack->size() - num_args;
  for (size_t i = first; i < stack->size(); ++i) (*stack)[i] = MapTensors((*stack)[i], Wrapped);
  {
    c10::impl::LocalDispatchKeySet tls = c10::impl::tls_local_dispatch_key_set();
    c10::impl::ForceDispatchKeyGuard functionalize(
        tls.included_, tls.excluded_.remove(c10::DispatchKey::Functionalize));
    op.callBoxedForDispatchKey(c10::DispatchKey::CompositeExplicitAutograd, *stack);
  }
  const size_t num_returns = op.schema().returns().size();
  for (size_t i = stack->size() - num_returns; i < stack->size(); ++i)
    (*stack)[i] = MapTensors((*stack)[i], Unwrapped);
}

// A kernel for `op` when it is a custom op of that kind (no kernel of its own for the device or
// the CPU, a composite explicit one, no mutated arguments). Whether it was decided.
bool Handle(const c10::OperatorName& name) {
  auto op = c10::Dispatcher::singleton().findOp(name);
  if (!op || !op->hasSchema()) return false;
  if (!op->hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutograd)) {
    // Not registered yet, or never will be: decided once the op has any kernel.
    return op->hasKernelForDispatchKey(c10::DispatchKey::CPU) ||
           op->hasKernelForDispatchKey(c10::DispatchKey::CompositeImplicitAutograd);
  }
  if (op->schema().is_mutable() || op->hasKernelForDispatchKey(c10::DispatchKey::PrivateUse1) ||
      op->hasKernelForDispatchKey(c10::DispatchKey::CPU))
    return true;
  const std::string& full = name.name;
  const size_t sep = full.find("::");
  std::string ns = full.substr(0, sep), short_name = full.substr(sep + 2);
  if (!name.overload_name.empty()) short_name += "." + name.overload_name;
  static auto* libraries = new std::vector<std::unique_ptr<torch::Library>>();
  libraries->push_back(std::make_unique<torch::Library>(
      torch::Library::IMPL, ns, c10::DispatchKey::PrivateUse1, __FILE__, __LINE__));
  libraries->back()->impl(short_name.c_str(),
                          torch::CppFunction::makeFromBoxedFunction<&RunFunctionalized>());
  return true;
}

}  // namespace

void RegisterCustomOpListener() {
  static c10::RegistrationHandleRAII* handle = new c10::RegistrationHandleRAII(
      c10::Dispatcher::singleton().addRegistrationListener(std::make_unique<NewOps>()));
  (void)handle;
  RegisterPendingCustomOps();
}

void RegisterPendingCustomOps() {
  if (!g_pending.load(std::memory_order_acquire)) return;
  std::vector<c10::OperatorName> ops;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    ops.swap(Pending());
    g_pending.store(false, std::memory_order_release);
  }
  std::vector<c10::OperatorName> undecided;
  for (const c10::OperatorName& name : ops)
    if (!Handle(name)) undecided.push_back(name);
  std::lock_guard<std::mutex> lock(g_mu);
  // Looked at again with the next new op (their kernels come after their schema).
  Pending().insert(Pending().end(), undecided.begin(), undecided.end());
}

}  // namespace spmd::aten
