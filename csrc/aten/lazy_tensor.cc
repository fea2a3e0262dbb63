#include "aten/lazy_tensor.h"

#include <ATen/FunctionalTensorWrapper.h>
#include <c10/util/Exception.h>

#include <algorithm>

#include "runtime/device_data.h"

namespace spmd::aten {

namespace {

// Weak references to every slot ever handed out; compacted as slots die.
struct SlotRegistry {
  std::mutex mu;
  std::vector<std::weak_ptr<LazySlot>> slots;
  size_t compact_at = 1024;

  void Add(const SlotPtr& s) {
    std::lock_guard<std::mutex> lock(mu);
    slots.push_back(s);
    if (slots.size() >= compact_at) {
      Compact();
      compact_at = std::max<size_t>(1024, slots.size() * 2);
    }
  }
  void Compact() {
    // (std::remove_if, not a hand-written loop: self-move-assigning a weak_ptr empties it,
    // which dropped every live slot here and made mark_step sync nothing.)
    slots.erase(std::remove_if(slots.begin(), slots.end(),
                               [](const std::weak_ptr<LazySlot>& w) { return w.expired(); }),
                slots.end());
  }
};

SlotRegistry& Registry() {
  static auto* r = new SlotRegistry();
  return *r;
}

}  // namespace

namespace {
void* (*g_release_gil)() = nullptr;
void (*g_restore_gil)(void*) = nullptr;
}  // namespace

void SetGilHooks(void* (*release)(), void (*restore)(void*)) {
  g_release_gil = release;
  g_restore_gil = restore;
}

void GraphLock::lock() {
  if (mutex_.try_lock()) return;
  void* gil = g_release_gil ? g_release_gil() : nullptr;
  mutex_.lock();
  if (gil) g_restore_gil(gil);
}

GraphLock& GraphMutex() {
  static auto* mu = new GraphLock();
  return *mu;
}

c10::Device SpmdDevice() { return c10::Device(c10::DeviceType::PrivateUse1, 0); }

LazyImpl::LazyImpl(SlotPtr slot, const TensorType& type)
    : c10::TensorImpl(c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                      c10::scalarTypeToTypeMeta(runtime::ToScalarType(type.dtype)),
                      SpmdDevice()),
      slot_(std::move(slot)) {
  set_sizes_contiguous(type.shape);
  // A storage of no bytes and no data: the values live on the emulated devices, reached
  // through the slot, and no kernel ever runs on this tensor's memory. It exists so that code
  // which only asks for storage identity (torch.library custom ops check that outputs alias
  // no input by `id(t.untyped_storage())`; Hugging Face's grouped_mm fallback on torch < 2.8
  // is one) works; shallow copies (detach) share it, as they share the slot.
  storage_ = c10::Storage(c10::Storage::use_byte_size_t(), 0,
                          c10::DataPtr(nullptr, SpmdDevice()), /*allocator=*/nullptr,
                          /*resizable=*/false);
}

c10::intrusive_ptr<c10::TensorImpl> LazyImpl::shallow_copy_and_detach(
    const c10::VariableVersion& version_counter, bool allow_tensor_metadata_change) const {
  auto impl = c10::make_intrusive<LazyImpl>(slot_, slot_->value.type());
  copy_tensor_metadata(this, impl.get(), version_counter, allow_tensor_metadata_change);
  return impl;
}

c10::intrusive_ptr<c10::TensorImpl> LazyImpl::shallow_copy_and_detach(
    c10::VariableVersion&& version_counter, bool allow_tensor_metadata_change) const {
  auto impl = c10::make_intrusive<LazyImpl>(slot_, slot_->value.type());
  copy_tensor_metadata(this, impl.get(), std::move(version_counter),
                       allow_tensor_metadata_change);
  return impl;
}

void LazyImpl::shallow_copy_from(const c10::intrusive_ptr<c10::TensorImpl>& impl) {
  auto* other = dynamic_cast<LazyImpl*>(impl.get());
  TORCH_CHECK(other != nullptr, "cannot shallow-copy a non-spmd tensor into an spmd tensor");
  copy_tensor_metadata(other, this, version_counter(), allow_tensor_metadata_change());
  slot_ = other->slot_;
  refresh_numel();
  refresh_contiguous();
}

LazyImpl* TryGetLazyImpl(const at::Tensor& t) {
  if (!t.defined()) return nullptr;
  c10::TensorImpl* impl = t.unsafeGetTensorImpl();
  if (auto* lazy = dynamic_cast<LazyImpl*>(impl)) return lazy;
  if (at::functionalization::impl::isFunctionalTensor(t)) {
    at::functionalization::impl::sync(t);
    at::Tensor inner = at::functionalization::impl::from_functional_tensor(t);
    return dynamic_cast<LazyImpl*>(inner.unsafeGetTensorImpl());
  }
  return nullptr;
}

LazyImpl* GetLazyImpl(const at::Tensor& t, const char* what) {
  LazyImpl* impl = TryGetLazyImpl(t);
  TORCH_CHECK(impl != nullptr, "expected an spmd tensor for ", what, ", got a tensor on ",
              t.defined() ? t.device().str() : std::string("(undefined)"));
  return impl;
}

at::Tensor MakeLazyTensor(const ir::Value& value) {
  auto slot = std::make_shared<LazySlot>();
  slot->value = value;
  Registry().Add(slot);
  return at::Tensor(c10::make_intrusive<LazyImpl>(std::move(slot), value.type()));
}

at::Tensor MakeFunctionalLazyTensor(const ir::Value& value) {
  return at::functionalization::impl::to_functional_tensor(MakeLazyTensor(value));
}

void SetSlotValue(const SlotPtr& slot, ir::Value value) { slot->value = std::move(value); }

std::vector<SlotPtr> PendingSlots() {
  SlotRegistry& r = Registry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.Compact();
  std::vector<SlotPtr> out;
  for (const auto& w : r.slots) {
    SlotPtr s = w.lock();
    if (s && s->value.valid() && !s->value.node->is_data()) out.push_back(std::move(s));
  }
  return out;
}

std::vector<SlotPtr> LiveSlots() {
  SlotRegistry& r = Registry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.Compact();
  std::vector<SlotPtr> out;
  for (const auto& w : r.slots)
    if (SlotPtr s = w.lock()) out.push_back(std::move(s));
  return out;
}

int64_t LiveSlotCount() {
  SlotRegistry& r = Registry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.Compact();
  return static_cast<int64_t>(r.slots.size());
}

}  // namespace spmd::aten
