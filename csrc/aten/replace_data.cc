#include "aten/replace_data.h"

#include <ATen/FunctionalTensorWrapper.h>

#include "aten/lazy_tensor.h"

namespace spmd::aten {

void ReplaceData(const at::Tensor& dst, const at::Tensor& src) {
  namespace fn = at::functionalization::impl;
  std::lock_guard<GraphLock> lock(GraphMutex());
  GetLazyImpl(dst, "the tensor whose data is replaced");
  at::Tensor value = MakeLazyTensor(GetLazyImpl(src, "the new data")->slot()->value);
  c10::TensorImpl* impl = dst.unsafeGetTensorImpl();
  // Metadata changes (shape, dtype) are the purpose here, as with `.data =`.
  bool allow = impl->allow_tensor_metadata_change();
  impl->set_allow_tensor_metadata_change(true);
  if (fn::isFunctionalTensor(dst)) {
    auto* wrapper = fn::unsafeGetFunctionalWrapper(dst);
    // replace_ would cast the new value to the wrapper's dtype: adopt the new dtype first.
    if (wrapper->dtype() != value.dtype())
      wrapper->set_storage_and_dtype(wrapper->unsafe_storage(), value.dtype());
    wrapper->replace_(value);  // also takes the new sizes
    // Make the new value the storage's base, so aliases regenerate from it and the old base
    // (the previous data) is no longer referenced by the storage.
    wrapper->commit_update();
    wrapper->apply_updates();
  } else {
    impl->shallow_copy_from(value.getIntrusivePtr());  // LazyImpl: slot, sizes and dtype
  }
  impl->set_allow_tensor_metadata_change(allow);
}

}  // namespace spmd::aten
