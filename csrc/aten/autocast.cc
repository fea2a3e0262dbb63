// torch.autocast("spmd"): torch's CUDA autocast policy on the spmd device.
//
// While autocast is enabled for the device, the AutocastPrivateUse1 dispatch key sits in front
// of every op on it. torch registers nothing for that key (out-of-tree backends bring their own
// policy), so without this file every op there failed ("Could not run 'aten::matmul' with
// arguments from the 'Autocastspmd' backend"). The kernels are torch's own: its op lists and
// cast wrappers from ATen/autocast_mode.h, registered the way torch registers them for CUDA.
// An op of the lower-precision list (matmuls, linear, convolutions, attention) casts its
// floating operands to the autocast dtype (bfloat16 unless the user picks another: the default
// is set in torch_spmd/_device.py); ops that need range or precision (softmax, norms, losses,
// exp/log, sums) run in float32; ops of several operands in the promote list run in the widest
// operand type. The casts are ordinary `_to_copy` ops and are recorded like any other, so the
// partitioner sees, shards and prices the mixed-precision program as written. Every other op
// falls through to the next dispatch key unchanged.
#include <ATen/autocast_mode.h>
#include <torch/library.h>

#include "aten/backend.h"

namespace spmd::aten {

namespace {

// torch bans binary_cross_entropy under CUDA autocast (its own kernel for that is not exported,
// so the message is repeated here): a low-precision sigmoid output before it loses the range
// the log needs. The fused with-logits variants are in the fp32 list and safe.
at::Tensor BinaryCrossEntropyBanned(const at::Tensor&, const at::Tensor&,
                                    const std::optional<at::Tensor>&, int64_t) {
  TORCH_CHECK(false,
              "torch.nn.functional.binary_cross_entropy and torch.nn.BCELoss are unsafe to "
              "autocast.\nMany models use a sigmoid layer right before the binary cross entropy "
              "layer.\nIn this case, combine the two layers using "
              "torch.nn.functional.binary_cross_entropy_with_logits\nor torch.nn.BCEWithLogitsLoss. "
              " binary_cross_entropy_with_logits and BCEWithLogits are\nsafe to autocast.");
}

// The KERNEL_* macros below call `m.impl(...)`, and the signatures in torch's lists name ATen
// types unqualified (torch expands them inside namespace at).
void RegisterPolicy(torch::Library& m) {
  using namespace at;  // NOLINT(build/namespaces)
#define SPMD_AUTOCAST_LOWER_PRECISION_FP(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, lower_precision_fp)
  AT_FORALL_LOWER_PRECISION_FP(SPMD_AUTOCAST_LOWER_PRECISION_FP)
#undef SPMD_AUTOCAST_LOWER_PRECISION_FP

#define SPMD_AUTOCAST_FP32(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32)
  AT_FORALL_FP32(SPMD_AUTOCAST_FP32)
#undef SPMD_AUTOCAST_FP32

  // Reductions with an optional dtype argument get dtype=float32 when the caller left it unset.
#define SPMD_AUTOCAST_FP32_SET_OPT_DTYPE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32_set_opt_dtype)
  AT_FORALL_FP32_SET_OPT_DTYPE(SPMD_AUTOCAST_FP32_SET_OPT_DTYPE)
#undef SPMD_AUTOCAST_FP32_SET_OPT_DTYPE

  // norm redispatches to its overload that takes a dtype (float32).
  AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE(KERNEL_DIFFERENT_REDISPATCH_SIGNATURE_PRIVATEUSEONE)

#define SPMD_AUTOCAST_PROMOTE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, promote)
  AT_FORALL_PROMOTE(SPMD_AUTOCAST_PROMOTE)
#undef SPMD_AUTOCAST_PROMOTE

  m.impl(TORCH_SELECTIVE_NAME("aten::binary_cross_entropy"), TORCH_FN(BinaryCrossEntropyBanned));
}

}  // namespace

void RegisterAutocast() {
  // The libraries live as long as the process: the dispatcher drops their kernels with them.
  static const bool registered = [] {
    auto* fallthrough = new torch::Library(torch::Library::IMPL, "_",
                                           c10::DispatchKey::AutocastPrivateUse1, __FILE__, __LINE__);
    fallthrough->fallback(torch::CppFunction::makeFallthrough());
    auto* policy = new torch::Library(torch::Library::IMPL, "aten",
                                      c10::DispatchKey::AutocastPrivateUse1, __FILE__, __LINE__);
    RegisterPolicy(*policy);
    return true;
  }();
  (void)registered;
}

}  // namespace spmd::aten
