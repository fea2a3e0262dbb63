// In-place updates of functional tensors, folded as soon as they happen.
//
// torch 1.13's functionalization turns `t.add_(x)` into `tmp = add(t, x)`, swaps `tmp` into the
// wrapper and queues it on the storage's alias (`commit_update`). The queue is only drained when
// *another* alias of the storage is read; a tensor updated in place with no view of it keeps
// every intermediate value in the queue, and the alias keeps its very first value as the base.
// For the spmd device that is a leak with teeth: each queued value is a live lazy tensor, so
// every mark_step computes it as a graph output and keeps its buffers, and an optimizer step
// (Adam: five in-place ops per parameter) grows device memory by several parameter copies per
// step. torch >= 2.0 drains the queue right after each in-place op; this does the same.
//
// How: the ADInplaceOrView kernel of an in-place or out= op is generic (redispatch below
// ADInplaceOrView, then bump the mutated tensor's version). We replace it, for ops that mutate
// exactly one tensor argument, with the same two steps plus `apply_updates()` on the mutated
// tensor when it is a functional wrapper. Core functionalization still does all the work; only
// the queue is drained earlier. Non-spmd tensors see exactly the original behaviour.
#include <ATen/FunctionalTensorWrapper.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/library.h>

#include <memory>
#include <set>
#include <string>

#include "aten/backend.h"

namespace spmd::aten {

namespace {

// In-place view ops and storage-resizing ops: functionalization handles them specially (view
// metadata, storage replacement), so their ADInplaceOrView kernels stay untouched.
const std::set<std::string>& Excluded() {
  static const auto* names = new std::set<std::string>{
      "aten::set_",           "aten::resize_",     "aten::resize_as_", "aten::_resize_output_",
      "aten::detach_",        "aten::transpose_",  "aten::t_",         "aten::squeeze_",
      "aten::unsqueeze_",     "aten::as_strided_", "aten::swapaxes_",  "aten::swapdims_",
      "aten::requires_grad_", "aten::_coalesced_", "aten::retain_grad"};
  return *names;
}

// The position of the only tensor argument the op writes to, or -1.
int SingleWrittenTensor(const c10::FunctionSchema& schema) {
  int found = -1;
  for (size_t i = 0; i < schema.arguments().size(); ++i) {
    const c10::Argument& arg = schema.arguments()[i];
    const c10::AliasInfo* alias = arg.alias_info();
    if (!alias || !alias->isWrite()) continue;
    if (found >= 0 || arg.type()->kind() != c10::TypeKind::TensorType) return -1;
    found = static_cast<int>(i);
  }
  return found;
}

void InplaceOrViewFolding(const c10::OperatorHandle& op, c10::DispatchKeySet ks,
                          torch::jit::Stack* stack) {
  const c10::FunctionSchema& schema = op.schema();
  int written = SingleWrittenTensor(schema);
  size_t num_args = schema.arguments().size();
  at::Tensor target = (*stack)[stack->size() - num_args + written].toTensor();
  {
    at::AutoDispatchBelowADInplaceOrView guard;
    op.redispatchBoxed(ks & c10::after_ADInplaceOrView_keyset, stack);
  }
  target.unsafeGetTensorImpl()->bump_version();
  namespace fn = at::functionalization::impl;
  if (fn::isFunctionalTensor(target)) fn::unsafeGetFunctionalWrapper(target)->apply_updates();
}

class SilentWarningHandler : public c10::WarningHandler {
 public:
  void process(const c10::SourceLocation&, const std::string&, const bool) override {}
};

}  // namespace

void RegisterInplaceUpdateFolding() {
  auto& dispatcher = c10::Dispatcher::singleton();
  // Replacing core's kernels warns once per op; the replacement is intended.
  static SilentWarningHandler silent;
  c10::Warning::WarningHandlerGuard guard(&silent);
  static auto* lib = new torch::Library(torch::Library::IMPL, "aten",
                                        c10::DispatchKey::ADInplaceOrView, __FILE__, __LINE__);
  for (const c10::OperatorName& name : dispatcher.getAllOpNames()) {
    if (name.name.rfind("aten::", 0) != 0 || Excluded().count(name.name)) continue;
    auto op = dispatcher.findOp(name);
    if (!op || !op->hasSchema()) continue;
    if (!op->hasKernelForDispatchKey(c10::DispatchKey::ADInplaceOrView)) continue;
    const c10::FunctionSchema& schema = op->schema();
    if (SingleWrittenTensor(schema) < 0 || schema.returns().size() != 1) continue;
    std::string short_name = name.name.substr(6);
    if (!name.overload_name.empty()) short_name += "." + name.overload_name;
    lib->impl(short_name.c_str(),
              torch::CppFunction::makeFromBoxedFunction<&InplaceOrViewFolding>());
  }
}

}  // namespace spmd::aten
