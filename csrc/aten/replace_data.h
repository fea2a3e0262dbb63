// Swapping the data behind an spmd tensor, keeping the tensor object: what `t.data = new` does
// for CPU tensors, also across shapes and dtypes and without bumping the version counter
// (torch 1.13 ignored `.data =` on functional tensors altogether). PyTorch/XLA's FSDP frees
// and rebuilds full parameters this way (`torch_xla._XLAC._replace_xla_tensor`).
#pragma once
#include <ATen/Tensor.h>

namespace spmd::aten {

// `dst` takes `src`'s current value, shape and dtype. Views and aliases of `dst` regenerate from
// the new value the next time they are read (their old value is no longer referenced through
// `dst`), and `dst`'s previous value is released unless something else holds it. Unlike an
// in-place op it does not bump `dst`'s version: autograd keeps the saved `dst` valid, which is
// the point (the tensor stands for the same parameter).
void ReplaceData(const at::Tensor& dst, const at::Tensor& src);

}  // namespace spmd::aten
