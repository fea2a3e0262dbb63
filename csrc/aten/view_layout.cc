#include "aten/view_layout.h"

#include <ATen/ATen.h>

#include "core/hash.h"

namespace spmd::aten {

namespace {

// A meta tensor with the sizes, strides and storage offset of `impl`.
at::Tensor MetaWithLayout(const LazyImpl* impl) {
  auto options = at::TensorOptions().dtype(impl->dtype()).device(c10::kMeta);
  int64_t extent = impl->storage_offset() + 1;
  for (int64_t d = 0; d < impl->dim(); ++d) {
    if (impl->sizes()[d] == 0) return at::empty_strided(impl->sizes(), impl->strides(), options);
    extent += (impl->sizes()[d] - 1) * impl->strides()[d];
  }
  return at::empty({extent}, options)
      .as_strided(impl->sizes(), impl->strides(), impl->storage_offset());
}

// The key of a view's layout: its arguments' signature and the input's strides and offset.
uint64_t ViewLayoutKey(uint64_t signature, const LazyImpl* in) {
  uint64_t key = HashCombine(signature, HashInt(in->storage_offset()));
  for (int64_t stride : in->strides()) key = HashCombine(key, HashInt(stride));
  return key;
}

// The layouts of a view op's outputs for `in`'s layout, found by running the view op on meta
// tensors (`meta_stack`: the op's arguments as meta tensors), and cached under `key`.
const std::vector<OpPlan::ViewLayout>& CacheViewLayouts(OpPlan& plan, uint64_t key,
                                                        const LazyImpl* in,
                                                        torch::jit::Stack meta_stack) {
  std::vector<OpPlan::ViewLayout> layouts;
  try {
    meta_stack[0] = MetaWithLayout(in);
    plan.view_op->callBoxed(&meta_stack);
    for (const c10::IValue& v : meta_stack) {
      auto add = [&](const at::Tensor& t) {
        layouts.push_back({t.sizes().vec(), t.strides().vec(), t.storage_offset()});
      };
      if (v.isTensor()) add(v.toTensor());
      else if (v.isTensorList())
        for (at::Tensor t : v.toTensorList()) add(t);
    }
  } catch (const std::exception&) {
    layouts.clear();  // no layout for these arguments: the outputs keep contiguous metadata
  }
  if (plan.view_layout_cache.size() >= OpPlan::kMaxCachedShapes) plan.view_layout_cache.clear();
  return plan.view_layout_cache.emplace(key, std::move(layouts)).first->second;
}

}  // namespace

const std::vector<OpPlan::ViewLayout>& ViewLayoutsFor(OpPlan& plan, uint64_t signature,
                                                      const LazyImpl* in,
                                                      const std::vector<c10::IValue>& meta) {
  const uint64_t key = ViewLayoutKey(signature, in);
  auto it = plan.view_layout_cache.find(key);
  return it != plan.view_layout_cache.end() ? it->second : CacheViewLayouts(plan, key, in, meta);
}

void ApplyViewLayout(const std::vector<OpPlan::ViewLayout>& layouts,
                     const std::vector<at::Tensor>& outputs) {
  if (layouts.size() != outputs.size()) return;
  for (size_t i = 0; i < outputs.size(); ++i) {
    auto* out = dynamic_cast<LazyImpl*>(outputs[i].unsafeGetTensorImpl());
    if (!out || out->sizes() != c10::IntArrayRef(layouts[i].sizes)) continue;
    out->set_sizes_and_strides(layouts[i].sizes, layouts[i].strides);
    out->set_storage_offset(layouts[i].storage_offset);
  }
}

}  // namespace spmd::aten
