// torch.matmul recorded as ONE node with its own autograd, when the matmul rule says so
// (partition/rules/matmul.h: two >= 3-D operands with equal batch dims). Other shapes keep the
// composite definition.
#include <ATen/ATen.h>
#include <ATen/FunctionalTensorWrapper.h>
#include <ATen/ops/matmul_native.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

#include <memory>

#include "aten/backend.h"
#include "aten/lazy_tensor.h"
#include "aten/op_plan.h"
#include "aten/recorder.h"
#include "partition/rules/matmul.h"

namespace spmd::aten {

namespace {

class BatchedMatmul : public torch::autograd::Function<BatchedMatmul> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& a,
                            const at::Tensor& b) {
    ctx->save_for_backward({a, b});
    // Record aten::matmul directly: the dispatcher would decompose it (it is composite, and
    // giving it a backend kernel changes its autograd kernels for every backend).
    namespace F = at::functionalization::impl;
    auto inner = [](const at::Tensor& t) {
      if (!F::isFunctionalTensor(t)) return t;
      F::sync(t);
      return F::from_functional_tensor(t);
    };
    static const c10::OperatorHandle op =
        c10::Dispatcher::singleton().findSchemaOrThrow("aten::matmul", "");
    torch::jit::Stack stack{inner(a), inner(b)};
    {
      std::lock_guard<GraphLock> lock(GraphMutex());
      RecordOp(GetOpPlan(op), &stack);
    }
    at::Tensor out = stack.back().toTensor();
    return F::isFunctionalTensor(a) ? F::to_functional_tensor(out) : out;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const at::Tensor& a = saved[0];
    const at::Tensor& b = saved[1];
    const at::Tensor& g = grads[0];
    // d(a @ b)/da = g @ b^T, d/db = a^T @ g: batched matmuls of the same kind.
    at::Tensor ga = ctx->needs_input_grad(0) ? at::matmul(g, b.transpose(-1, -2)) : at::Tensor();
    at::Tensor gb = ctx->needs_input_grad(1) ? at::matmul(a.transpose(-1, -2), g) : at::Tensor();
    return {ga, gb};
  }
};

// Whether `t` holds a recorded value (through its functionalization wrapper, if any). Fake
// tensors that dynamo and AOTAutograd make of spmd tensors carry the spmd device, and with it
// this kernel's dispatch key, but nothing to record.
bool Recordable(const at::Tensor& t) {
  namespace F = at::functionalization::impl;
  const at::Tensor& inner = F::isFunctionalTensor(t) ? F::unsafeGetFunctionalWrapper(t)->value() : t;
  return TryGetLazyImpl(inner) != nullptr;
}

at::Tensor MatmulAutograd(const at::Tensor& a, const at::Tensor& b) {
  if (Recordable(a) && Recordable(b) &&
      partition::RecordMatmulWhole(Shape(a.sizes().begin(), a.sizes().end()),
                                   Shape(b.sizes().begin(), b.sizes().end())))
    return BatchedMatmul::apply(a, b);
  return at::native::matmul(a, b);  // the composite definition, differentiated op by op
}

}  // namespace

void RegisterBatchedMatmul() {
  static auto* lib = new torch::Library(torch::Library::IMPL, "aten",
                                        c10::DispatchKey::AutogradPrivateUse1, __FILE__, __LINE__);
  lib->impl("matmul", TORCH_FN(MatmulAutograd));
}

}  // namespace spmd::aten
