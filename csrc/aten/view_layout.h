// The strides and storage offset a view of an spmd tensor reports, as a strided device's view
// would report them.
#pragma once
#include <ATen/Tensor.h>

#include <vector>

#include "aten/lazy_tensor.h"
#include "aten/op_plan.h"

namespace spmd::aten {

// A view must *describe itself* as a strided device's view would, whatever the layout of the
// buffer behind it: stride(), storage_offset(), is_contiguous() and as_strided on views read
// it. A functionalization wrapper reports its inner value's sizes and strides (custom
// sizes/strides policy), so each view output gets the strides and storage offset that running
// the view op on a meta tensor with its input's layout gives (layouts compose along view
// chains). Buffers keep the layout their CPU kernel gave them; the few ops that interpret
// strides (as_strided_copy/scatter on a root, which is described as contiguous) get contiguous
// inputs at replay (the runtime's kernel calls). (torch 1.13's autograd also replayed views through these
// strides; torch 2.x replays functional views with view functions instead.) The layouts are
// memoized: a training loop records the same views of the same layouts every step.


// The layouts of view op `plan`'s outputs for input `in` (arguments of shape-cache signature
// `signature`; `meta`: them as meta tensors), from the plan's cache or found now. Callers hold
// GraphMutex, which guards the cache.
const std::vector<OpPlan::ViewLayout>& ViewLayoutsFor(OpPlan& plan, uint64_t signature,
                                                      const LazyImpl* in,
                                                      const std::vector<c10::IValue>& meta);

// Gives each output the layout found for it (none when the counts or sizes disagree).
void ApplyViewLayout(const std::vector<OpPlan::ViewLayout>& layouts,
                     const std::vector<at::Tensor>& outputs);

}  // namespace spmd::aten
