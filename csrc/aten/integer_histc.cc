// histc of integer tensors on the device.
//
// The devices run torch's CPU kernels, and CPU's histc takes floating inputs only; CUDA's takes
// integers too. Hugging Face's MoE layers count the tokens routed to each expert with
// `torch.histc(expert_ids.int(), ...)` on every device but CPU and MPS, so Mixtral's default
// (grouped_mm) experts failed here. On integer input we count in float32 (exact below 2^24
// elements) and return the input's dtype, as CUDA does; floating input is recorded as it is.
#include <ATen/ATen.h>
#include <torch/library.h>

#include "aten/backend.h"
#include "aten/recorder.h"

namespace spmd::aten {

namespace {

void HistcOfIntegers(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const size_t self_at = stack->size() - op.schema().arguments().size();
  const at::Tensor self = (*stack)[self_at].toTensor();
  const bool integral = at::isIntegralType(self.scalar_type(), /*includeBool=*/true);
  if (integral) (*stack)[self_at] = self.to(at::kFloat);
  LazyFallback(op, stack);
  if (integral) stack->back() = stack->back().toTensor().to(self.scalar_type());
}

}  // namespace

void RegisterIntegerHistc() {
  static auto* lib = new torch::Library(torch::Library::IMPL, "aten", c10::DispatchKey::PrivateUse1,
                                        __FILE__, __LINE__);
  lib->impl("histc", torch::CppFunction::makeFromBoxedFunction<&HistcOfIntegers>());
}

}  // namespace spmd::aten
