#include "aten/backend.h"

#include <ATen/ATen.h>
#include <ATen/FunctionalTensorWrapper.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/library.h>

#include <memory>
#include <mutex>

#include "aten/lazy_tensor.h"
#include "aten/recorder.h"

namespace spmd::aten {

namespace {

// One logical device (as in PyTorch/XLA's SPMD mode): the emulated devices behind it are the
// runtime's business. A guard implementation is mandatory for `.to(device)` to work at all.
struct GuardImpl final : public c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override { return c10::DeviceType::PrivateUse1; }
  c10::Device exchangeDevice(c10::Device) const override { return SpmdDevice(); }
  c10::Device getDevice() const override { return SpmdDevice(); }
  void setDevice(c10::Device) const override {}
  void uncheckedSetDevice(c10::Device) const noexcept override {}
  c10::Stream getStream(c10::Device d) const noexcept override {
    return c10::Stream(c10::Stream::DEFAULT, d);
  }
  c10::Stream exchangeStream(c10::Stream s) const noexcept override { return s; }
  c10::DeviceIndex deviceCount() const noexcept override { return 1; }
};
C10_REGISTER_GUARD_IMPL(PrivateUse1, GuardImpl);

// Core functionalization keeps only XLA and Lazy outputs of _to_copy functional; a dtype cast
// on the spmd device must stay functional too, or later view mutations lose their aliasing.
at::Tensor ToCopyFunctionalize(const at::Tensor& self, c10::optional<at::ScalarType> dtype,
                               c10::optional<at::Layout> layout,
                               c10::optional<at::Device> device, c10::optional<bool> pin_memory,
                               bool non_blocking, c10::optional<at::MemoryFormat> memory_format) {
  namespace F = at::functionalization::impl;
  at::Tensor self_ = self;
  if (F::isFunctionalTensor(self)) {
    F::sync(self);
    self_ = F::from_functional_tensor(self);
  }
  at::Tensor out;
  {
    at::AutoDispatchSkipFunctionalize guard;
    out = at::_to_copy(self_, dtype, layout, device, pin_memory, non_blocking, memory_format);
  }
  c10::Device target = device ? *device : self.device();
  bool opted_in = target.type() == c10::DeviceType::PrivateUse1 ||
                  target.type() == c10::DeviceType::XLA || target.type() == c10::DeviceType::Lazy;
  bool included =
      c10::impl::tls_local_dispatch_key_set().included_.has(c10::DispatchKey::Functionalize);
  if (!included && !opted_in) return out;
  return F::to_functional_tensor(out);
}

std::unique_ptr<torch::Library>& CaptureLibrary() {
  static auto* lib = new std::unique_ptr<torch::Library>();
  return *lib;
}
int g_num_captured = 0;

}  // namespace

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&LazyFallback>());
}

// Swallows the one expected warning: replacing core's Functionalize kernel for _to_copy.
class SilentWarningHandler : public c10::WarningHandler {
 public:
  void process(const c10::SourceLocation&, const std::string&, const bool) override {}
};

void RegisterBackend() {
  static std::once_flag once;
  std::call_once(once, [] {
    auto& dispatcher = c10::Dispatcher::singleton();
    auto lib = std::make_unique<torch::Library>(torch::Library::IMPL, "aten",
                                                c10::DispatchKey::PrivateUse1, __FILE__, __LINE__);
    for (const c10::OperatorName& name : dispatcher.getAllOpNames()) {
      if (name.name.rfind("aten::", 0) != 0) continue;
      auto op = dispatcher.findOp(name);
      if (!op || !op->hasSchema()) continue;
      if (op->hasKernelForDispatchKey(c10::DispatchKey::CompositeImplicitAutograd)) continue;
      if (op->hasKernelForDispatchKey(c10::DispatchKey::PrivateUse1)) continue;
      bool explicit_composite =
          op->hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutograd) ||
          op->hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutogradNonFunctional);
      if (!explicit_composite) continue;
      // detach's composite kernel is a shallow copy, which shares our slot: keep it.
      if (name.name == "aten::detach") continue;
      std::string short_name = name.name.substr(6);
      if (!name.overload_name.empty()) short_name += "." + name.overload_name;
      lib->impl(short_name.c_str(), torch::CppFunction::makeFromBoxedFunction<&LazyFallback>());
      ++g_num_captured;
    }
    CaptureLibrary() = std::move(lib);

    static SilentWarningHandler silent;
    c10::Warning::WarningHandlerGuard guard(&silent);
    static auto* functionalize = new torch::Library(
        torch::Library::IMPL, "aten", c10::DispatchKey::Functionalize, __FILE__, __LINE__);
    functionalize->impl("_to_copy", TORCH_FN(ToCopyFunctionalize));
    RegisterInplaceUpdateFolding();
  });
}

int NumCapturedOps() { return g_num_captured; }

}  // namespace spmd::aten
