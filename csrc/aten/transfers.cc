#include "aten/transfers.h"

#include <ATen/ATen.h>

#include "aten/lazy_tensor.h"
#include "aten/op_plan.h"
#include "aten/recorder.h"
#include "aten/sharding_api.h"
#include "aten/sync.h"
#include "core/metrics.h"

namespace spmd::aten {

namespace {

at::Tensor HostValue(LazyImpl* impl) { return Materialize(impl->slot())->ToHost(); }

// Uploads `src` (a tensor of any other device) into the lazy tensor `dst`: broadcast to dst's
// shape and cast to its dtype, as copy_ does.
at::Tensor HostLike(const TensorType& type, const at::Tensor& src) {
  return src.to(c10::kCPU, runtime::ToScalarType(type.dtype)).expand(type.shape).contiguous();
}

void UploadInto(LazyImpl* dst, const at::Tensor& src) {
  Count("TransferToDevice");
  SetSlotValue(dst->slot(), UploadValue(HostLike(dst->slot()->value.type(), src)));
}

// For copy_/copy(self, src): the lazy self when src is a host tensor to upload; nullptr when
// the copy is an ordinary device op (recorded). 0-dim host tensors are scalars, recorded too.
LazyImpl* HostCopyTarget(const at::Tensor& self, const at::Tensor& src) {
  LazyImpl* dst = TryGetLazyImpl(self);
  if (!dst || TryGetLazyImpl(src) || src.dim() == 0) return nullptr;
  return dst;
}

}  // namespace

// _to_copy(self, *, dtype, layout, device, pin_memory, non_blocking, memory_format)
void ToCopy(OpPlan& plan, torch::jit::Stack* stack) {
  auto args = torch::jit::last(*stack, 7);
  at::Tensor self = args[0].toTensor();
  auto dtype = args[1].toOptional<at::ScalarType>();
  auto device = args[3].toOptional<c10::Device>();
  LazyImpl* impl = TryGetLazyImpl(self);
  at::Tensor result;
  if (!impl) {
    Count("TransferToDevice");
    at::Tensor host = self.to(c10::kCPU, dtype.value_or(self.scalar_type()));
    result = WrapOutput(UploadValue(host), /*factory=*/true);
  } else if (device && device->type() != c10::DeviceType::PrivateUse1) {
    Count("TransferFromDevice");
    at::Tensor host = HostValue(impl);
    // Always a fresh tensor: device buffers are shared and immutable.
    result = host.to(*device, dtype.value_or(host.scalar_type()), /*non_blocking=*/false,
                     /*copy=*/true);
  } else {
    return RecordOp(plan, stack);
  }
  torch::jit::drop(*stack, 7);
  stack->push_back(result);
}

// copy_(self, src, non_blocking): self is on the device.
void CopyInPlace(OpPlan& plan, torch::jit::Stack* stack) {
  auto args = torch::jit::last(*stack, 3);
  at::Tensor self = args[0].toTensor();
  at::Tensor src = args[1].toTensor();
  LazyImpl* dst = HostCopyTarget(self, src);
  if (!dst) return RecordOp(plan, stack);
  UploadInto(dst, src);
  torch::jit::drop(*stack, 3);
  stack->push_back(self);
}

// copy(self, src, non_blocking) -> Tensor: the functional copy_ that torch 2.x's
// functionalization calls for self.copy_(src). With a host src: a fresh upload of src, cast and
// broadcast to self's dtype and shape.
void CopyFunctional(OpPlan& plan, torch::jit::Stack* stack) {
  auto args = torch::jit::last(*stack, 3);
  at::Tensor self = args[0].toTensor();
  at::Tensor src = args[1].toTensor();
  LazyImpl* dst = HostCopyTarget(self, src);
  if (!dst) return RecordOp(plan, stack);
  Count("TransferToDevice");
  at::Tensor result =
      WrapOutput(UploadValue(HostLike(dst->slot()->value.type(), src)), /*factory=*/true);
  torch::jit::drop(*stack, 3);
  stack->push_back(result);
}

// _copy_from(self=src, dst, non_blocking) and _copy_from_and_resize(self=src, dst)
void CopyFrom(OpPlan& plan, torch::jit::Stack* stack) {
  size_t n = plan.info->args.size();
  auto args = torch::jit::last(*stack, n);
  at::Tensor src = args[0].toTensor();
  at::Tensor dst = args[1].toTensor();
  LazyImpl* src_impl = TryGetLazyImpl(src);
  LazyImpl* dst_impl = TryGetLazyImpl(dst);
  if (dst_impl && n == 2 && dst.sizes() != src.sizes()) dst_impl->set_sizes_contiguous(src.sizes());
  if (src_impl && !dst_impl) {
    Count("TransferFromDevice");
    at::Tensor host = HostValue(src_impl);
    if (n == 2) dst.resize_(host.sizes());
    dst.copy_(host);
  } else if (!src_impl && dst_impl) {
    if (n == 2) SetSlotValue(dst_impl->slot(), UploadValue(at::empty(dst.sizes(), dst.options().device(c10::kCPU))));
    UploadInto(dst_impl, src);
  } else {
    TORCH_CHECK(src_impl && dst_impl, "_copy_from between two host tensors reached the spmd device");
    // Device to device: dst takes src, cast and broadcast, through the recorded copy_.
    dst.copy_(src);
  }
  torch::jit::drop(*stack, n);
  stack->push_back(dst);
}

// _local_scalar_dense(self) -> Scalar: Tensor.item().
void LocalScalarDense(OpPlan& plan, torch::jit::Stack* stack) {
  at::Tensor self = stack->back().toTensor();
  Count("TransferFromDevice");
  at::Scalar value = HostValue(GetLazyImpl(self)).item();
  torch::jit::drop(*stack, 1);
  stack->push_back(value);
}

// resize_(self, size, memory_format): only a lazy value of the new shape (contents undefined,
// as in ATen).
void Resize(OpPlan& plan, torch::jit::Stack* stack) {
  auto args = torch::jit::last(*stack, 3);
  at::Tensor self = args[0].toTensor();
  std::vector<int64_t> size = args[1].toIntVector();
  LazyImpl* impl = GetLazyImpl(self);
  if (self.sizes().vec() != size) {
    impl->set_sizes_contiguous(size);
    SetSlotValue(impl->slot(), UploadValue(at::zeros(size, self.options().device(c10::kCPU))));
  }
  torch::jit::drop(*stack, 3);
  stack->push_back(self);
}

// detach_copy, alias_copy, lift_fresh(_copy): the result has the input's value. IR values
// are immutable, so the new tensor simply shares it: no node, nothing to compute, and a
// parameter made by Module.to() (a detached upload) is still device data that mark_sharding
// can lay out at once.
void SameValue(OpPlan& plan, torch::jit::Stack* stack) {
  size_t n = plan.info->args.size();
  auto args = torch::jit::last(*stack, n);
  at::Tensor self = args[0].toTensor();
  LazyImpl* impl = TryGetLazyImpl(self);
  if (!impl || !impl->slot()->value.valid()) return RecordOp(plan, stack);
  at::Tensor out = MakeLazyTensor(impl->slot()->value);
  torch::jit::drop(*stack, n);
  stack->push_back(out);
}

// clone: the clone of a tensor the user annotated carries the annotation, as PyTorch/XLA's
// clone copies its source's sharding spec: it reports that sharding at once (deepcopy too,
// which clones) and is laid out alike.
void CloneKeepingAnnotation(OpPlan& plan, torch::jit::Stack* stack) {
  const size_t n = plan.info->args.size();
  const c10::IValue& self = torch::jit::peek(*stack, 0, n);
  LazyImpl* impl = self.isTensor() ? TryGetLazyImpl(self.toTensor()) : nullptr;
  const SlotPtr source = impl ? impl->slot() : nullptr;
  RecordOp(plan, stack);
  if (source && source->annotation.valid() && stack->back().isTensor())
    CarryAnnotation(source, stack->back().toTensor());
}

}  // namespace spmd::aten
