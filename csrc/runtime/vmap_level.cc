#include "runtime/vmap_level.h"

#include <ATen/ATen.h>
#include <ATen/functorch/BatchedFallback.h>
#include <ATen/functorch/BatchedTensorImpl.h>
#include <ATen/functorch/DynamicLayer.h>

namespace spmd::runtime {

namespace ft = at::functorch;

VmapLevel::VmapLevel(int64_t batch_size) : batch_size_(batch_size) {
  // Ops without a batching rule run functorch's per-row loop; the executor counts them itself
  // (UnbatchedOps), so the user's log is spared a warning per op.
  fallback_warning_ = ft::isVmapFallbackWarningEnabled();
  ft::setVmapFallbackWarningEnabled(false);
  // Random ops never run batched (the executor draws each tile's values itself), so a random
  // kernel reached here is an error, not a silently shared draw.
  level_ = ft::initAndPushDynamicLayer(ft::TransformType::Vmap, c10::SymInt(batch_size),
                                       ft::RandomnessType::Error);
}

VmapLevel::~VmapLevel() { Pop(); }

at::Tensor VmapLevel::Batched(const at::Tensor& rows) const {
  return ft::makeBatched(rows, 0, level_);
}

void VmapLevel::Pop() {
  if (!pushed_) return;
  pushed_ = false;
  ft::popDynamicLayerAndDeleteMetadata();
  ft::setVmapFallbackWarningEnabled(fallback_warning_);
}

at::Tensor VmapLevel::Rows(const at::Tensor& result) const {
  const ft::BatchedTensorImpl* batched = ft::maybeGetBatchedImpl(result);
  if (batched == nullptr || batched->level() != level_) return {};
  // The level is popped: plain ATen calls on the underlying value.
  return batched->value().movedim(batched->bdim(), 0);
}

}  // namespace spmd::runtime
