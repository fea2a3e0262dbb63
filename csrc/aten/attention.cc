// scaled_dot_product_attention on the device runs the fused kernel wherever CPU eager does.
//
// torch asks each backend which SDPA implementation to use through `_fused_sdp_choice_stub`
// (a DispatchStub with a PrivateUse1 slot). Unanswered, it takes the math path: matmul,
// softmax (mask) and matmul, whose [b, h, s_q, s_kv] scores become values of the step, so a
// long-sequence plan reports a false "does not fit" and prices attention as memory-bound
// pointwise ops. We answer as CPU eager does, with torch's own CPU choice (dropout 0, 4-D
// inputs, a 2-D or 4-D mask that needs no gradient, grouped-query attention where that torch's
// CPU kernel takes it, and the user's `sdpa_kernel` selection). `flash_attention` makes torch
// call `_scaled_dot_product_flash_attention_for_cpu` and, in the backward, its `_backward`:
// the very kernels the devices run, each recorded as one node with a sharding rule
// (partition/rules/attention.cc). `math` keeps the decomposition. Either way the device
// computes what CPU eager computes.
//
// Not the `overrideable` backend torch keeps for PrivateUse1: torch 2.6 has no meta kernel for
// `_scaled_dot_product_fused_attention_overrideable` (the recorder takes shapes from meta
// kernels), it returns SymInts (max_q, max_k) that a recorded op cannot hand back lazily, and
// the devices would run the CPU flash kernel behind it all the same.
#include <ATen/ATen.h>
#include <ATen/native/transformers/attention.h>
#include <ATen/ops/_fused_sdp_choice_native.h>

#include "aten/backend.h"

namespace spmd::aten {

namespace {

int64_t SdpChoice(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                  const std::optional<at::Tensor>& attn_mask, double dropout_p, bool is_causal,
                  std::optional<double> scale, bool enable_gqa) {
  return at::native::_fused_sdp_choice_cpp(query, key, value, attn_mask, dropout_p, is_causal,
                                           scale, enable_gqa);
}

}  // namespace

void RegisterFusedAttention() {
#ifndef USE_XPU
  // The stub's PrivateUse1 slot lies after an XPU slot that only torch builds with XPU have
  // (DispatchStub.h): there this file, built without USE_XPU, would write the wrong slot. Such
  // a torch keeps the math path.
  if (at::hasXPU()) return;
#endif
  at::native::_fused_sdp_choice_stub.set_privateuse1_dispatch_ptr(&SdpChoice);
}

}  // namespace spmd::aten
