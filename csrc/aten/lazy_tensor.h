// The spmd device's tensors. A LazyImpl has no storage; it points at a LazySlot holding the
// tensor's current value in the IR: either a pending op output or a data node whose data is
// already on the devices. Shallow copies (detach, .data) share the slot, the way CPU tensors
// share storage, so assigning a new value through one is seen by all.
#pragma once
#include <ATen/Tensor.h>
#include <c10/core/TensorImpl.h>

#include <memory>
#include <mutex>
#include <vector>

#include "ir/node.h"

namespace spmd::aten {

struct LazySlot {
  ir::Value value;
  // The user's sharding annotation (xs.mark_sharding). It belongs to the tensor, as in
  // PyTorch/XLA: in-place updates (an optimizer step) keep the tensor in this layout.
  Sharding annotation;
};
using SlotPtr = std::shared_ptr<LazySlot>;

class LazyImpl final : public c10::TensorImpl {
 public:
  LazyImpl(SlotPtr slot, const TensorType& type);

  const SlotPtr& slot() const { return slot_; }

  c10::intrusive_ptr<c10::TensorImpl> shallow_copy_and_detach(
      const c10::VariableVersion& version_counter,
      bool allow_tensor_metadata_change) const override;
  c10::intrusive_ptr<c10::TensorImpl> shallow_copy_and_detach(
      c10::VariableVersion&& version_counter, bool allow_tensor_metadata_change) const override;
  void shallow_copy_from(const c10::intrusive_ptr<c10::TensorImpl>& impl) override;

 private:
  SlotPtr slot_;
};

// The lock every graph mutation and sync takes: autograd records backward ops on its own
// thread. Recursive, since an eager fallback syncs from inside an op. Waiting for it never
// holds Python's GIL (SetGilHooks): its holder may need the GIL (an op releasing a tensor
// that has a Python object, under torch's bindings, which run ops without the GIL), and a
// Python thread that waited with the GIL (a binding such as mark_sharding) would deadlock it.
class GraphLock {
 public:
  void lock();
  void unlock() { mutex_.unlock(); }
  bool try_lock() { return mutex_.try_lock(); }

 private:
  std::recursive_mutex mutex_;
};
GraphLock& GraphMutex();
// How GraphLock lets go of the GIL while it waits (set by the Python module): `release`
// returns what `restore` needs to take it back, nullptr when this thread did not hold it.
void SetGilHooks(void* (*release)(), void (*restore)(void*));

// The spmd device (privateuseone:0).
c10::Device SpmdDevice();

// The LazyImpl behind `t`, looking through a functionalization wrapper (after applying its
// pending updates). nullptr when `t` is not an spmd tensor.
LazyImpl* TryGetLazyImpl(const at::Tensor& t);
// Like TryGetLazyImpl, but throws a RuntimeError naming `what` when `t` is not an spmd tensor.
LazyImpl* GetLazyImpl(const at::Tensor& t, const char* what = "tensor");

// A new (non-functional) spmd tensor holding `value`; registered as live.
at::Tensor MakeLazyTensor(const ir::Value& value);
// Same, wrapped for functionalization, as factory outputs and host->device copies must be.
at::Tensor MakeFunctionalLazyTensor(const ir::Value& value);

// Points a slot at a new value (keeps it registered as live).
void SetSlotValue(const SlotPtr& slot, ir::Value value);

// Every live slot whose value is still pending (not a data node).
std::vector<SlotPtr> PendingSlots();
// Every live slot.
std::vector<SlotPtr> LiveSlots();
// Number of live spmd tensors (for tests and debugging).
int64_t LiveSlotCount();

}  // namespace spmd::aten
