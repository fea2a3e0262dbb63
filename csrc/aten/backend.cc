#include "aten/backend.h"

#include <ATen/ATen.h>
#include <ATen/FunctionalStorageImpl.h>
#include <ATen/FunctionalTensorWrapper.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>
#include <torch/library.h>

#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>

#include "aten/backward_scope.h"
#include "aten/lazy_tensor.h"
#include "aten/named_ops.h"
#include "aten/op_plan.h"
#include "aten/recorder.h"
#include "aten/shape_functions.h"
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

// Functionalization (torch 2.6 to 2.13) has three problems that reach spmd users; we wrap the
// Functionalize kernels of the ops concerned.
// 1. (kDetach) detach() of a view returns a shallow copy of the view wrapper that keeps the
//    shared storage but not the view's place in it: once the base has been mutated, the copy
//    "regenerates" from the base and pins superseded buffers (steady training memory grows).
//    Fix: a detached view becomes a new root holding the view's current value; it no longer
//    aliases the base (in-place writes to a detached *view* do not reach the base), while
//    detached roots, parameters and detaches of detaches keep aliasing, which zero_grad,
//    clip_grad_norm_ and loading into model.state_dict() rely on (see the kDetach case).
// 2. (kInplace, kOut) Its mutating kernels assert "mutating a non-functional tensor with a
//    functional tensor is not allowed" (an INTERNAL ASSERT asking users to report a PyTorch
//    bug) when a host tensor meets an spmd tensor. Fix: check devices first and raise
//    PyTorch's usual device-mismatch error; copy_ between the host and the device stays legal
//    in both directions.
// 3. (kInplace, kInplaceList) An in-place write replaces the tensor's value: the user's
//    sharding annotation must move to the new value, and the write is queued on the shared
//    storage as an update that only a later sync of an alias applies. Parameters are views
//    (nn.Parameter detaches the tensor it wraps) whose base nobody reads, so their updates
//    would queue up forever, each pinning a device buffer. Fix: carry the annotation, apply
//    the update at once. List ops (`_foreach_add_`, `_fused_adam_`: what optimizers run by
//    default on an accelerator) need the same per element, and are functionalized here (see
//    UpdateListsInPlace).
// (torch 1.13 needed two more fixes, for the storage offsets of views and of in-place results;
// torch 2.6 computes those right.)
enum class FixKind : uint8_t { kInplace, kInplaceList, kDetach, kOut };

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
      for (at::Tensor t : v.toTensorList()) visit(t);
    else if (v.isList())  // Tensor?[]: index tensors, which may live on the host (as with CUDA)
      for (const c10::IValue& e : v.toListRef())
        if (e.isTensor() && F::isFunctionalTensor(e.toTensor())) any_functional = true;
  }
  if (!any_functional || !host) return false;
  if (NamedOpSays(op.schema().name(), &NamedOp::may_write_host)) {
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
  // kInplaceList: the functional variant (`X` for `X_`), when torch has one.
  c10::optional<c10::OperatorHandle> functional;
};

std::unordered_map<const c10::FunctionSchema*, WrappedKernel>& WrappedKernels() {
  static auto* kernels = new std::unordered_map<const c10::FunctionSchema*, WrappedKernel>();
  return *kernels;
}

// kInplaceList. torch's generated functionalization kernels for these ops refuse a call in
// which one written list is empty and another holds device tensors ("mutating a non-functional
// tensor with a functional tensor", an internal assert): Adam's max_exp_avg_sqs without
// amsgrad, SGD's first momentum buffers. So these ops are functionalized here, the same way for
// all of them: sync and unwrap every argument, run the functional variant (`X` for `X_`, which
// returns the new value of each written list, in order) below functionalization, and commit
// each result to its list element. Each element keeps its sharding annotation and has its
// queued updates applied, as single-tensor in-place ops do.
void UpdateListsInPlace(const c10::OperatorHandle& op, c10::DispatchKeySet ks,
                        torch::jit::Stack* stack, const WrappedKernel& k) {
  namespace F = at::functionalization::impl;
  const c10::FunctionSchema& schema = op.schema();
  const auto& args = schema.arguments();
  size_t first = stack->size() - args.size();
  bool any_functional = false;
  for (size_t i = first; i < stack->size(); ++i) {
    const c10::IValue& v = (*stack)[i];
    if (v.isTensor()) any_functional |= F::isFunctionalTensor(v.toTensor());
    else if (v.isTensorList())
      for (at::Tensor t : v.toTensorList()) any_functional |= F::isFunctionalTensor(t);
  }
  if (!any_functional || !k.functional) return k.original.callBoxed(op, ks, stack);

  std::vector<std::pair<at::Tensor, SlotPtr>> written;  // every written element, in order
  torch::jit::Stack call;
  for (size_t i = 0; i < args.size(); ++i) {
    const c10::IValue& v = (*stack)[first + i];
    bool writes = args[i].alias_info() && args[i].alias_info()->isWrite();
    auto unwrap = [&](const at::Tensor& t) {
      if (!t.defined() || !F::isFunctionalTensor(t)) return t;
      F::sync(t);
      if (writes) {
        LazyImpl* impl = TryGetLazyImpl(t);
        written.emplace_back(t, impl ? impl->slot() : nullptr);
      }
      return F::from_functional_tensor(t);
    };
    if (v.isTensor()) {
      call.push_back(unwrap(v.toTensor()));
    } else if (v.isTensorList()) {
      c10::List<at::Tensor> list;
      for (at::Tensor t : v.toTensorList()) list.push_back(unwrap(t));
      call.push_back(list);
    } else {
      call.push_back(v);
    }
  }
  {
    at::AutoDispatchSkipFunctionalize guard;
    k.functional->callBoxed(&call);
  }
  std::vector<at::Tensor> results;
  for (const c10::IValue& v : call)
    for (at::Tensor t : v.toTensorList()) results.push_back(t);
  TORCH_CHECK(results.size() == written.size(), schema.name(), ": its functional variant returned ",
              results.size(), " tensors for ", written.size(), " written ones");
  for (size_t i = 0; i < written.size(); ++i)
    CommitInPlace(written[i].first, results[i], written[i].second);
  torch::jit::drop(*stack, args.size());
}

// detach on a functional spmd tensor: a copy of its value, or torch's alias where one is
// safe (below).
void FunctionalDetach(const WrappedKernel& k, const c10::OperatorHandle& op,
                      c10::DispatchKeySet ks, torch::jit::Stack* stack, const at::Tensor& self) {
  namespace F = at::functionalization::impl;
  const size_t num_args = op.schema().arguments().size();
  // Other devices' functional tensors (AOTAutograd tracing a CPU or CUDA model under
  // torch.compile) keep torch's detach, an alias of self as its schema says: a copy there
  // breaks the tracer's storage aliasing. So do fake spmd tensors (AOTAutograd tracing a
  // program on spmd tensors): they hold no LazyImpl.
  if (self.device().type() != c10::DeviceType::PrivateUse1 ||
      !dynamic_cast<LazyImpl*>(F::from_functional_tensor(self).unsafeGetTensorImpl()))
    return k.original.callBoxed(op, ks, stack);
  // A detach is metadata to the program the user wrote; what functionalization runs for it
  // (a sync, a detach_copy) is not shown to an active Python dispatch mode. Selective
  // activation checkpointing ignores aten.detach because checkpointing runs a different
  // number of them in the forward and the recomputation; it would count these copies and
  // fail. (Only while a mode is active: tensor subclasses dispatch on the same key.)
  std::optional<c10::impl::ExcludeDispatchKeyGuard> hide_from_modes;
  if (c10::impl::TorchDispatchModeTLS::stack_len() > 0)
    hide_from_modes.emplace(c10::DispatchKey::Python);
  F::sync(self);
  at::Tensor value = F::from_functional_tensor(self);
  auto* storage = dynamic_cast<at::functionalization::FunctionalStorageImpl*>(
      self.storage().unsafeGetStorageImpl());
  // After a sync a root's value is its storage's base; a view's value never is. Two kinds
  // of views keep aliasing too, as on CPU, since regenerating from the base, all the
  // shallow copy can do, gives them exactly and keeps nothing alive that they did not: one
  // holding its base's very IR value (a detach of a detach: a state_dict entry), and a
  // parameter (nn.Parameter detaches the tensor it wraps: a view covering its whole base,
  // which lives as long as the parameter). So loading into model.state_dict() updates the
  // model. Other views keep the copy: a gradient's view (a transpose back to the base's
  // shape) holds a value of its own, and an alias would keep its base alive with it.
  const at::Tensor& base = storage ? storage->base() : value;
  auto* base_impl = dynamic_cast<LazyImpl*>(base.unsafeGetTensorImpl());
  auto* value_impl = dynamic_cast<LazyImpl*>(value.unsafeGetTensorImpl());
  const bool whole = base.sizes() == value.sizes() && base.strides() == value.strides() &&
                     base.storage_offset() == value.storage_offset() &&
                     base.dtype() == value.dtype();
  const bool base_value =
      base_impl && value_impl && base_impl->slot()->value == value_impl->slot()->value;
  const bool parameter = self.requires_grad() && self.is_leaf();
  if (storage && base.unsafeGetTensorImpl() != value.unsafeGetTensorImpl() &&
      !(whole && (base_value || parameter))) {
    at::Tensor detached;
    {
      at::AutoDispatchSkipFunctionalize guard;
      detached = at::detach_copy(value);
    }
    torch::jit::drop(*stack, num_args);
    stack->push_back(F::to_functional_tensor(detached));
    return;
  }
  k.original.callBoxed(op, ks, stack);
}

void FunctionalizeWithFixes(const c10::OperatorHandle& op, c10::DispatchKeySet ks,
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

  if (k.kind == FixKind::kDetach) return FunctionalDetach(k, op, ks, stack, self);
  if (k.kind == FixKind::kInplaceList) {
    CheckMutationDevices(op, *stack, num_args);  // (copy_ is not a list op)
    return UpdateListsInPlace(op, ks, stack, k);
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
  // kInplace
  LazyImpl* before = TryGetLazyImpl(self);
  SlotPtr previous = before ? before->slot() : nullptr;
  k.original.callBoxed(op, ks, stack);
  CarryAnnotation(previous, self);  // the user's sharding stays with the tensor
  ApplyQueuedUpdates(self);
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
  const NamedOp* named = FindNamedOp(name.name);
  const FunctionalizeFix fix = named ? named->functionalize : FunctionalizeFix::kBySchema;
  if (!in->isWrite())
    return fix == FunctionalizeFix::kDetach ? c10::optional<FixKind>(FixKind::kDetach) : c10::nullopt;
  if (fix == FunctionalizeFix::kNone) return c10::nullopt;  // metadata only (named_ops.cc)
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
    c10::optional<c10::OperatorHandle> functional;
    if (*kind == FixKind::kInplaceList && name.name.back() == '_')
      functional = dispatcher.findSchema(
          {name.name.substr(0, name.name.size() - 1), name.overload_name});
    WrappedKernels().emplace(
        &op->schema(),
        WrappedKernel{c10::TypedOperatorHandle<KernelPeek>::Lookup(
                          *op, c10::DispatchKey::Functionalize),
                      *kind, functional});
    std::string short_name = name.name.substr(6);
    if (!name.overload_name.empty()) short_name += "." + name.overload_name;
    lib.impl(short_name.c_str(),
             torch::CppFunction::makeFromBoxedFunction<&FunctionalizeWithFixes>());
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
      if (NamedOpSays(name.name, &NamedOp::keeps_composite_kernel)) continue;
      std::string short_name = name.name.substr(6);
      if (!name.overload_name.empty()) short_name += "." + name.overload_name;
      // List ops without a sharding rule (_foreach_norm, ...), which would run replicated,
      // decompose into per-tensor ops (their composite kernels loop) instead of being recorded
      // as one node. Those taking a Scalar[] (an optimizer's per-parameter step sizes, new
      // every step) are recorded whole: each value is a run-time scalar, so steps do not
      // recompile.
      if (name.name.rfind("aten::_foreach_", 0) == 0 && !partition::HasRuleFor("aten::" + short_name))
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
    RegisterFusedAttention();
    RegisterIntegerHistc();
    RegisterCustomOpListener();
    RegisterHooks();
    RegisterAutocast();
    EnsureAutogradDeviceQueue();
    InstallInBackwardResolver();
    RegisterMissingMetaKernels();
  });
}

int NumCapturedOps() { return g_num_captured; }

}  // namespace spmd::aten
