// Materialization: cut the pending IR of some tensors into a graph, compile it (or hit the
// cache), run it on the devices and point the tensors at the results.
#pragma once
#include <ATen/Tensor.h>

#include <unordered_map>
#include <vector>

#include "aten/lazy_tensor.h"
#include "partition/program.h"
#include "runtime/device_data.h"

namespace spmd::aten {

// Executes the pending values of `slots` as one graph. On failure every slot keeps its
// pending value (nothing is half-updated) and the error propagates.
void SyncSlots(const std::vector<SlotPtr>& slots);
// Executes everything pending (mark_step).
void SyncAll();
// The device data behind `slot`, syncing it first if it is pending.
runtime::DeviceDataPtr Materialize(const SlotPtr& slot);
// The host (CPU) value of an spmd tensor.
at::Tensor ToHost(const at::Tensor& t);

}  // namespace spmd::aten
