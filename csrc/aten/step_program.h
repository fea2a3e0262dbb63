// The program a step runs: the session's partitioning options, the compiled program for a
// graph (through the compile cache), and the parameters laid out as it expects them.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "aten/auto_sharding.h"
#include "ir/graph.h"
#include "partition/partitioner.h"
#include "runtime/device_data.h"
#include "runtime/executable.h"

namespace spmd::aten {

// The session's options (the setters below change them). Callers hold GraphMutex.
partition::PartitionOptions& Options();

// The options a step's graph is partitioned with, and their part of its compile key: the
// session's, and under auto-sharding the layouts chosen for its unannotated parameters.
struct StepOptions {
  partition::PartitionOptions options = Options();
  std::optional<AutoLayouts> auto_layouts;
  Hash key = 0;

  explicit StepOptions(const ir::Graph& graph);
  StepOptions(const StepOptions&) = delete;  // (options points into auto_layouts)
};

// The key a step's program is cached under: the graph's, the options', the device count's.
Hash StepKey(const ir::Graph& graph, const StepOptions& step);

// The executable of `graph`, compiled or from the compile cache.
std::shared_ptr<runtime::Executable> GetExecutable(const ir::Graph& graph);

// Whether a parameter's data must be relaid out (through a private copy) for the program.
bool NeedsRelayout(const ir::NodePtr& param, const Sharding& expected);

// The parameters of `graph` laid out as `program` expects them. One relaid out is a private
// copy for this run: it is marked donated, freed after its last use.
std::vector<runtime::DeviceDataPtr> ProgramParams(const ir::Graph& graph,
                                                  const partition::Program& program,
                                                  std::vector<bool>& donated);

// Whether a step may hand back pending partial sums (see PartitionOptions); part of the
// compile cache key.
void SetDeferOutputReductions(bool defer);
bool DeferOutputReductions();
// Collective matmul (partition/windowed_einsum.h) for collectives of at least `bytes` per
// device (-1, any negative: off) whose steps keep `min_step_extent` of the windowed dim.
void SetWindowedEinsum(int64_t bytes, int64_t min_step_extent);
// Context parallelism's method (partition::ContextParallel as an int: auto, ring, all-to-all,
// gather).
void SetContextParallel(int method);
int ContextParallelMethod();
std::pair<int64_t, int64_t> WindowedEinsum();  // (bytes, min_step_extent)
// A compiling runtime's fusion in the memory figures (PartitionOptions::fused_memory).
void SetFusedMemory(bool on);
bool FusedMemory();

}  // namespace spmd::aten
