#include "aten/backend.h"

#include <ATen/ATen.h>
#include <ATen/FunctionalStorageImpl.h>
#include <ATen/FunctionalTensorWrapper.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include <torch/library.h>

#include <memory>
#include <mutex>
#include <string>
#include <typeinfo>
#include <unordered_map>
#include <unordered_set>

#include "aten/lazy_tensor.h"
#include "aten/recorder.h"
#include "aten/sharding_api.h"
#include "partition/rules/rule.h"
#include "runtime/device_data.h"

namespace spmd::aten {
struct KernelPeek;
}  // namespace spmd::aten

namespace c10 {
// The kernel currently registered for one dispatch key of an op. c10 offers no API for this;
// OperatorHandle befriends every TypedOperatorHandle<>, so this specialization may read it.
// Used once at start-up, to wrap functionalization kernels (see WrapFunctionalizeKernels).
template <>
class TypedOperatorHandle<spmd::aten::KernelPeek> final {
 public:
  static KernelFunction Lookup(const OperatorHandle& op, DispatchKey key) {
    return op.operatorDef_->op.lookup(DispatchKeySet(key));
  }
};
}  // namespace c10

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

// Functionalization on torch 1.13 has four problems that reach spmd users. The first two are
// about view *metadata*, which matters because autograd treats PrivateUse1 as supporting
// as_strided: CopySlices (the backward of an in-place write through a view, e.g. a[:, 0] = 7
// or a[1:3, ::2] += x) replays the view on the base as
// as_strided(view.sizes(), view.strides(), view.storage_offset() - base offset).
// 1. Its view kernels compute a new view's strides and storage offset on a meta copy of the
//    input made by to_meta(), which drops the input's storage offset: every view's offset ends
//    up relative to its immediate parent (b[1][2:] has offset 2, 6 on CPU; b[1:3, ::2] has 0).
//    Fix: add the input's offset back (views are affine in it; as_strided takes an absolute
//    offset and dtype views rescale it, so those are left alone).
// 2. Its in-place kernels run the out-of-place op and replace_() the wrapper's value with the
//    result, taking the result's metadata (a wrapper reports its value's sizes and strides):
//    after v = b[1, 1:]; v.fill_(7), v has the result's strides and offset 0. Fix: an in-place
//    op never changes its self's layout, so restore it. (View values themselves carry the
//    view's strides: see ApplyViewLayout in recorder.cc.)
//    1 and 2 sent the gradients of in-place writes through views to the wrong elements.
// 3. detach() of a view returns a shallow copy of the view wrapper, and 1.13's
//    FunctionalTensorWrapper::shallow_copy_and_detach keeps the shared storage but drops the
//    view's ViewMetas and generation: once the base has been mutated, the copy "regenerates"
//    to the whole base (v = b[1]; v.mul_(2); v.detach() holds b's values, shaped like b).
//    LTC's 'lazy' device shows the same bug. Fix: a detached view becomes a new root holding
//    the view's current value; it no longer aliases the base (in-place writes to a detached
//    *view* do not reach the base), while detached roots keep aliasing, which zero_grad and
//    clip_grad_norm_ rely on. (Tensor.data of a view cannot be fixed here: it shallow-copies
//    without dispatching.)
// 4. Its mutating kernels (in-place and out=) assert "mutating a non-functional tensor with a
//    functional tensor is not allowed" (an INTERNAL ASSERT asking users to report a PyTorch
//    bug) when a host tensor meets an spmd tensor, and accept a host computation written into
//    an spmd out= tensor. Fix: check devices first and raise PyTorch's usual device-mismatch
//    error; copy_ between the host and the device stays legal in both directions.
// We wrap the Functionalize kernels of those ops (views, in-place and out= ops, detach).
// 5. (torch 2.x) List ops that update tensors in place and return nothing (`_foreach_add_`,
//    `_fused_adam_`: what optimizers run by default on an accelerator) mutate each list element
//    like an in-place op: the user's sharding stays with each tensor and the queued updates are
//    applied, as for single-tensor in-place ops (see kInplace below).
enum class FixKind : uint8_t { kView, kInplaceView, kInplace, kInplaceList, kDetach, kOut };

// For mutating ops: raises the usual device-mismatch error when spmd tensors (functional) and
// host tensors (other than 0-dim ones, which are allowed next to device tensors as with CUDA)
// meet. Returns true when the op is copy_ from an spmd tensor into a host tensor, which the
// caller performs itself.
bool CheckMutationDevices(const c10::OperatorHandle& op, const torch::jit::Stack& stack,
                          size_t num_args) {
  namespace F = at::functionalization::impl;
  const at::Tensor* host = nullptr;
  bool any_functional = false;
  auto visit = [&](const at::Tensor& t) {
    if (!t.defined()) return;
    if (F::isFunctionalTensor(t)) any_functional = true;
    else if (!host && t.device().type() != c10::DeviceType::PrivateUse1 &&
             !(t.device().is_cpu() && t.dim() == 0))
      host = &t;
  };
  for (size_t i = stack.size() - num_args; i < stack.size(); ++i) {
    const c10::IValue& v = stack[i];
    if (v.isTensor()) visit(v.toTensor());
    else if (v.isTensorList())
      for (const at::Tensor& t : v.toTensorList()) visit(t);
    else if (v.isList())
      for (const c10::IValue& e : v.toListRef())
        if (e.isTensor()) visit(e.toTensor());
  }
  if (!any_functional || !host) return false;
  if (op.schema().name() == "aten::copy_") {
    // Device -> host copy into a host tensor: legal; the caller does it. Host -> device: the
    // functionalization kernel uploads.
    return !F::isFunctionalTensor(stack[stack.size() - num_args].toTensor());
  }
  TORCH_CHECK(false, "Expected all tensors to be on the same device, but found at least two "
              "devices, ", SpmdDevice().str(), " and ", host->device().str(), "!");
}

struct WrappedKernel {
  c10::KernelFunction original;
  FixKind kind;
};

std::unordered_map<const c10::FunctionSchema*, WrappedKernel>& WrappedKernels() {
  static auto* kernels = new std::unordered_map<const c10::FunctionSchema*, WrappedKernel>();
  return *kernels;
}

// Applies the updates queued on a functional tensor's storage now. Parameters are views
// (nn.Parameter detaches the tensor it wraps) whose base nobody reads, so their updates would
// queue up forever, each pinning a device buffer. The same scatters are recorded either way.
void ApplyQueuedUpdates(const at::Tensor& t) {
  if (auto* storage = dynamic_cast<at::functionalization::FunctionalStorageImpl*>(
          t.storage().unsafeGetStorageImpl()))
    storage->apply_updates();
}

// kInplaceList: runs the functionalization kernel, then keeps every written list element's
// sharding annotation and applies its queued update.
void UpdateListsInPlace(const c10::OperatorHandle& op, c10::DispatchKeySet ks,
                        torch::jit::Stack* stack, const c10::KernelFunction& original) {
  namespace F = at::functionalization::impl;
  const auto& args = op.schema().arguments();
  size_t first = stack->size() - args.size();
  std::vector<std::pair<at::Tensor, SlotPtr>> written;
  for (size_t i = 0; i < args.size(); ++i) {
    const c10::IValue& v = (*stack)[first + i];
    if (!args[i].alias_info() || !args[i].alias_info()->isWrite() || !v.isTensorList()) continue;
    for (const at::Tensor& t : v.toTensorList()) {
      if (!t.defined() || !F::isFunctionalTensor(t)) continue;
      LazyImpl* impl = TryGetLazyImpl(t);
      written.emplace_back(t, impl ? impl->slot() : nullptr);
    }
  }
  original.callBoxed(op, ks, stack);
  for (const auto& [t, previous] : written) {
    CarryAnnotation(previous, t);
    ApplyQueuedUpdates(t);
  }
}

void FunctionalizeKeepingLayout(const c10::OperatorHandle& op, c10::DispatchKeySet ks,
                                torch::jit::Stack* stack) {
  namespace F = at::functionalization::impl;
  const WrappedKernel& k = WrappedKernels().at(&op.schema());
  size_t num_args = op.schema().arguments().size();
  const c10::IValue& first = (*stack)[stack->size() - num_args];
  at::Tensor self = first.isTensor() ? first.toTensor() : at::Tensor();
  bool mutating =
      k.kind == FixKind::kInplace || k.kind == FixKind::kInplaceList || k.kind == FixKind::kOut;
  if (!mutating && (!self.defined() || !F::isFunctionalTensor(self)))
    return k.original.callBoxed(op, ks, stack);

  if (k.kind == FixKind::kDetach) {
    F::sync(self);
    at::Tensor value = F::from_functional_tensor(self);
    auto* storage = dynamic_cast<at::functionalization::FunctionalStorageImpl*>(
        self.storage().unsafeGetStorageImpl());
    // After a sync a root's value is its storage's base; a view's value never is.
    if (storage && storage->base().unsafeGetTensorImpl() != value.unsafeGetTensorImpl()) {
      at::Tensor detached;
      {
        at::AutoDispatchSkipFunctionalize guard;
        detached = at::detach_copy(value);
      }
      torch::jit::drop(*stack, num_args);
      stack->push_back(F::to_functional_tensor(detached));
      return;
    }
    return k.original.callBoxed(op, ks, stack);
  }
  if (k.kind == FixKind::kInplaceList) {
    CheckMutationDevices(op, *stack, num_args);  // (copy_ is not a list op)
    return UpdateListsInPlace(op, ks, stack, k.original);
  }
  if (k.kind == FixKind::kInplace || k.kind == FixKind::kOut) {
    if (CheckMutationDevices(op, *stack, num_args)) {
      // self.copy_(spmd_src) with a host self: copy the source's host value.
      at::Tensor src = (*stack)[stack->size() - num_args + 1].toTensor();
      at::Tensor host_src = src.to(self.device());
      self.copy_(host_src);
      torch::jit::drop(*stack, num_args);
      stack->push_back(self);
      return;
    }
  }
  if (k.kind == FixKind::kOut || !self.defined() || !F::isFunctionalTensor(self))
    return k.original.callBoxed(op, ks, stack);
  if (k.kind == FixKind::kInplace) {
    std::vector<int64_t> sizes = self.sizes().vec(), strides = self.strides().vec();
    int64_t offset = self.storage_offset();
    LazyImpl* before = TryGetLazyImpl(self);
    SlotPtr previous = before ? before->slot() : nullptr;
    k.original.callBoxed(op, ks, stack);
    CarryAnnotation(previous, self);  // the user's sharding stays with the tensor
    // The write was queued on the shared storage as an update that only a later sync of an
    // alias applies (26 buffers pinned per Adam step of a 2-layer MLP otherwise).
    ApplyQueuedUpdates(self);
    // replace_() took the new value's metadata. The wrapper reports its value's sizes and
    // strides (custom sizes/strides policy), so restore self's strides on the value, and the
    // storage offset on both. (The new value may claim any layout: copy_ becomes
    // expand_copy(src, self.sizes()), whose value says stride 0.)
    auto* value = dynamic_cast<LazyImpl*>(F::from_functional_tensor(self).unsafeGetTensorImpl());
    if (!value || value->sizes() != c10::IntArrayRef(sizes)) return;
    if (value->strides() != c10::IntArrayRef(strides)) value->set_sizes_and_strides(sizes, strides);
    if (value->storage_offset() != offset) value->set_storage_offset(offset);
    if (self.storage_offset() != offset) self.unsafeGetTensorImpl()->set_storage_offset(offset);
    return;
  }
  int64_t offset = self.storage_offset();
  std::string input = runtime::TypeOf(self).ToString();
  try {
    k.original.callBoxed(op, ks, stack);
  } catch (const std::exception& e) {
    // A view's output shape is inferred here (by a meta kernel, some written in Python), before
    // the recorder sees the op: name the op and its input like the recorder does. c10 error
    // subclasses such as IndexError keep their type.
    auto* c10_error = dynamic_cast<const c10::Error*>(&e);
    if (c10_error && typeid(e) != typeid(c10::Error)) throw;
    ClearPendingPythonError(e);
    TORCH_CHECK(false, op.schema().name(), ": cannot infer the output shape for input (self=",
                input, "): ", c10_error ? c10_error->what_without_backtrace() : e.what());
  }
  if (offset == 0) return;
  auto shift = [offset](const at::Tensor& t) {
    if (t.defined() && F::isFunctionalTensor(t))
      t.unsafeGetTensorImpl()->set_storage_offset(t.storage_offset() + offset);
  };
  if (k.kind == FixKind::kInplaceView) return shift(self);  // returns self itself
  for (const c10::IValue& v : *stack) {
    if (v.isTensor()) shift(v.toTensor());
    else if (v.isTensorList())
      for (const at::Tensor& t : v.toTensorList()) shift(t);
  }
}

// Which fix `schema` needs, if any.
c10::optional<FixKind> ClassifyForFix(const c10::OperatorName& name,
                                      const c10::FunctionSchema& schema) {
  if (schema.arguments().empty()) return c10::nullopt;
  const auto& in = schema.arguments()[0].alias_info();
  const auto& out = schema.returns().empty() ? in : schema.returns()[0].alias_info();
  if (!in || !in->isWrite()) {
    // out= variants (and other ops writing a later argument): device check only.
    for (const c10::Argument& a : schema.arguments())
      if (a.alias_info() && a.alias_info()->isWrite()) return FixKind::kOut;
  }
  if (!in || !out || in->isWrite() != out->isWrite()) return c10::nullopt;
  if (!in->isWrite()) {
    static const auto* absolute = new std::unordered_set<std::string>{
        "aten::as_strided", "aten::view_as_real", "aten::view_as_complex"};
    if (absolute->count(name.name) || (name.name == "aten::view" && name.overload_name == "dtype"))
      return c10::nullopt;
    return name.name == "aten::detach" ? FixKind::kDetach : FixKind::kView;
  }
  static const auto* inplace_views = new std::unordered_set<std::string>{
      "aten::t_", "aten::transpose_", "aten::squeeze_", "aten::unsqueeze_", "aten::swapaxes_",
      "aten::swapdims_"};
  if (inplace_views->count(name.name)) return FixKind::kInplaceView;
  // Ops that legitimately change their self's metadata.
  static const auto* reshaping = new std::unordered_set<std::string>{
      "aten::resize_", "aten::resize_as_", "aten::set_", "aten::as_strided_",
      "aten::_resize_output_"};
  if (reshaping->count(name.name)) return c10::nullopt;
  // An in-place op: self is written and returned.
  if (name.name.back() == '_' && schema.returns().size() == 1) return FixKind::kInplace;
  // An in-place list op: the lists are written, nothing is returned.
  if (schema.returns().empty() &&
      schema.arguments()[0].type()->kind() == c10::TypeKind::ListType)
    return FixKind::kInplaceList;
  return c10::nullopt;
}

void WrapFunctionalizeKernels(torch::Library& lib) {
  auto& dispatcher = c10::Dispatcher::singleton();
  for (const c10::OperatorName& name : dispatcher.getAllOpNames()) {
    if (name.name.rfind("aten::", 0) != 0) continue;
    auto op = dispatcher.findOp(name);
    if (!op || !op->hasSchema()) continue;
    auto kind = ClassifyForFix(name, op->schema());
    if (!kind || !op->hasKernelForDispatchKey(c10::DispatchKey::Functionalize)) continue;
    WrappedKernels().emplace(
        &op->schema(),
        WrappedKernel{c10::TypedOperatorHandle<KernelPeek>::Lookup(
                          *op, c10::DispatchKey::Functionalize),
                      *kind});
    std::string short_name = name.name.substr(6);
    if (!name.overload_name.empty()) short_name += "." + name.overload_name;
    lib.impl(short_name.c_str(),
             torch::CppFunction::makeFromBoxedFunction<&FunctionalizeKeepingLayout>());
  }
}

// Swallows c10 warnings while it lives: our deliberate kernel overrides would each print one.
class QuietWarnings {
 public:
  QuietWarnings() : guard_(&handler_) {}

 private:
  struct Drop final : c10::WarningHandler {
    void process(const c10::Warning&) override {}
  };
  Drop handler_;
  c10::WarningUtils::WarningHandlerGuard guard_;
};

bool HasScalarListArg(const c10::FunctionSchema& schema) {
  for (const c10::Argument& a : schema.arguments())
    if (auto list = a.type()->cast<c10::ListType>())
      if (list->getElementType()->kind() == c10::TypeKind::NumberType) return true;
  return false;
}

std::unique_ptr<torch::Library>& CaptureLibrary() {
  static auto* lib = new std::unique_ptr<torch::Library>();
  return *lib;
}
int g_num_captured = 0;

std::unique_ptr<torch::Library>& ViewLibrary() {
  static auto* lib = new std::unique_ptr<torch::Library>();
  return *lib;
}

}  // namespace

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&LazyFallback>());
}


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
      // Some list ops decompose into per-tensor ops (their composite kernels loop) instead of
      // being recorded as one node: those without a sharding rule (_foreach_norm, ...), which
      // would run replicated, and those taking a Scalar[] (an optimizer's per-parameter step
      // sizes, new every step), whose per-tensor ops take each scalar as a run-time value, so
      // that steps do not recompile.
      if (name.name.rfind("aten::_foreach_", 0) == 0 &&
          (!partition::HasRuleFor("aten::" + short_name) || HasScalarListArg(op->schema())))
        continue;
      lib->impl(short_name.c_str(), torch::CppFunction::makeFromBoxedFunction<&LazyFallback>());
      ++g_num_captured;
    }
    CaptureLibrary() = std::move(lib);

    auto view_lib = std::make_unique<torch::Library>(
        torch::Library::IMPL, "aten", c10::DispatchKey::Functionalize, __FILE__, __LINE__);
    {
      // Each override warns "Overriding a previously registered kernel": expected here.
      QuietWarnings quiet;
      WrapFunctionalizeKernels(*view_lib);
      view_lib->impl("_to_copy", TORCH_FN(ToCopyFunctionalize));
    }
    ViewLibrary() = std::move(view_lib);
    RegisterBatchedMatmul();
    RegisterHooks();
  });
}

int NumCapturedOps() { return g_num_captured; }

}  // namespace spmd::aten
