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

// The key of the graph computing `tensors` (with auto-sharding's part, AutoShardingKey):
// PyTorch/XLA's _XLAC._get_graph_hash.
Hash PendingGraphHash(const std::vector<at::Tensor>& tensors);
// The graph (global IR) and the partitioned program of the given tensors' pending values, as
// text, without executing anything.
std::string PendingGraphText(const std::vector<at::Tensor>& tensors);
// The device data that graph reads (its parameters, in the graph's order), as tensors sharing
// it; and the index among `params` of the data `t` holds (-1: none, or `t` is pending).
std::vector<at::Tensor> PendingGraphParameters(const std::vector<at::Tensor>& tensors);
int PendingGraphParameterIndex(const std::vector<at::Tensor>& params, const at::Tensor& t);
std::string PartitionedProgramText(const std::vector<at::Tensor>& tensors);

// Whether a step may hand back pending partial sums (see PartitionOptions); part of the
// compile cache key.
void SetDeferOutputReductions(bool defer);
bool DeferOutputReductions();
// Collective matmul (partition/windowed_einsum.h) for collectives of at least `bytes` per
// device (-1, any negative: off) whose steps keep `min_step_extent` of the windowed dim.
void SetWindowedEinsum(int64_t bytes, int64_t min_step_extent);
std::pair<int64_t, int64_t> WindowedEinsum();  // (bytes, min_step_extent)
// A compiling runtime's fusion in the memory figures (PartitionOptions::fused_memory).
void SetFusedMemory(bool on);
bool FusedMemory();

// The program of the most recent step (executed or planned) and the parameters that step
// donated; null before the first step.
std::shared_ptr<const partition::Program> LastProgram();
std::vector<bool> LastDonated();

// Statistics of the most recently executed program (collectives, memory, flops, fallbacks).
partition::ProgramStats LastStepStats();

}  // namespace spmd::aten
