// PyTorch/XLA's use_spmd(auto=True) for this backend: the parameters of a step that the script
// left unannotated get layouts chosen by the cost model (plan/auto_layout.h), once per
// graph, before it is partitioned. The mesh is XLA_AUTO_SPMD_MESH's shape ("4,2") over every
// device, or one axis over all of them (PyTorch/XLA's default, {n, 1}). A parameter whose data
// is tiled (the script's mark_sharding, or a previous step's choice) keeps its layout; the
// replicated ones' data is relaid out for the program as any parameter in another layout is (counted
// ReshardParameters), and what the step writes back comes out in the chosen layouts.
#pragma once
#include <optional>

#include "core/hash.h"
#include "ir/graph.h"
#include "partition/propagate.h"
#include "plan/hardware.h"

namespace spmd::aten {

// `hardware` prices the candidates (its hbm_bytes is the budget when planning; an executed
// step's budget is the device memory).
void SetAutoSharding(bool on, const plan::Hardware& hardware);
bool AutoSharding();

// What auto-sharding adds to a graph's key: 0 when off, else a hash of XLA_AUTO_SPMD_MESH's
// text (read now). PyTorch/XLA's graph hash changes with both alike.
Hash AutoShardingKey();

struct AutoLayouts {
  partition::ParamLayouts layouts;  // for PartitionOptions::param_layouts
  Hash key = 0;                     // the layouts by parameter position, for compile caches
};
// The layouts auto-sharding gives `graph`'s unannotated parameters: chosen on the first sight
// of the graph (counted CompileWithAutoSharding) and kept by graph key. nullopt when off or
// every parameter is laid out already.
std::optional<AutoLayouts> AutoLayoutsFor(const ir::Graph& graph, int64_t num_devices,
                                          bool planning, bool defer_output_reductions);

}  // namespace spmd::aten
