#include "aten/step_program.h"

#include <algorithm>

#include "aten/graph_template.h"
#include "core/error.h"
#include "core/metrics.h"
#include "runtime/compile_cache.h"
#include "runtime/plan_mode.h"
#include "runtime/process_span.h"

namespace spmd::aten {

namespace {

// The device data of a parameter, laid out as the program expects it (planned data with a
// known value made real).
runtime::DeviceDataPtr ParamData(const ir::NodePtr& param, const Sharding& expected) {
  auto data = std::static_pointer_cast<runtime::DeviceData>(param->data())->Materialized();
  bool have_replicated = data->is_replicated();
  bool want_replicated = !expected.valid() || expected.IsReplicated();
  if (have_replicated && want_replicated) return data;
  if (!want_replicated && data->sharding().valid() && data->sharding() == expected) return data;
  Count("ReshardParameters");
  return data->Relayout(expected);
}

}  // namespace

partition::PartitionOptions& Options() {
  static auto* options = new partition::PartitionOptions();
  return *options;
}

StepOptions::StepOptions(const ir::Graph& graph) {
  auto_layouts = AutoLayoutsFor(graph, runtime::GlobalDeviceCount(),
                                runtime::Planning(), options.defer_output_reductions);
  key = options.Key();
  if (auto_layouts) {
    options.param_layouts = &auto_layouts->layouts;
    key = HashCombine(key, auto_layouts->key);
  }
}

// (The device count too: an unannotated graph is the same graph on any device set.)
Hash StepKey(const ir::Graph& graph, const StepOptions& step) {
  return HashCombine(HashCombine(graph.key, step.key), HashInt(runtime::GlobalDeviceCount()));
}

std::shared_ptr<runtime::Executable> GetExecutable(const ir::Graph& graph) {
  auto& cache = runtime::CompileCache::Get();
  const StepOptions step(graph);
  const Hash key = StepKey(graph, step);
  // With several processes (runtime/process_span.h) each runs its own copy of the program:
  // they must all be about to run the same one, or a collective would wait forever.
  runtime::CheckSameProgramEverywhere(key, "step program");
  if (auto exe = cache.Lookup(key)) {
    Count("CachedCompile");
    return exe;
  }
  Count("UncachedCompile");
  ScopedTimer timer("CompileTime");
  auto exe = std::make_shared<runtime::Executable>(
      partition::PartitionGraph(graph, runtime::GlobalDeviceCount(), step.options));
  cache.Insert(key, exe);
  return exe;
}

bool NeedsRelayout(const ir::NodePtr& param, const Sharding& expected) {
  auto data = std::static_pointer_cast<runtime::DeviceData>(param->data());
  bool want_replicated = !expected.valid() || expected.IsReplicated();
  if (data->is_replicated() && want_replicated) return false;
  return want_replicated || !data->sharding().valid() || data->sharding() != expected;
}

std::vector<runtime::DeviceDataPtr> ProgramParams(const ir::Graph& graph,
                                                  const partition::Program& program,
                                                  std::vector<bool>& donated) {
  std::vector<runtime::DeviceDataPtr> params;
  params.reserve(graph.params.size());
  for (size_t i = 0; i < graph.params.size(); ++i) {
    params.push_back(ParamData(graph.params[i], program.param_shardings[i]));
    if (params.back() != graph.params[i]->data()) donated[i] = true;
  }
  return params;
}

void SetDeferOutputReductions(bool defer) {
  std::lock_guard<GraphLock> lock(GraphMutex());
  Options().defer_output_reductions = defer;
}

bool DeferOutputReductions() {
  std::lock_guard<GraphLock> lock(GraphMutex());
  return Options().defer_output_reductions;
}

void SetWindowedEinsum(int64_t bytes, int64_t min_step_extent) {
  std::lock_guard<GraphLock> lock(GraphMutex());
  Options().windowed_einsum_bytes = bytes < 0 ? -1 : bytes;
  Options().windowed_einsum_min_extent = std::max<int64_t>(min_step_extent, 1);
}

void SetFusedMemory(bool on) {
  std::lock_guard<GraphLock> lock(GraphMutex());
  Options().fused_memory = on;
}

bool FusedMemory() {
  std::lock_guard<GraphLock> lock(GraphMutex());
  return Options().fused_memory;
}

void SetContextParallel(int method) {
  SPMD_CHECK(method >= 0 && method <= static_cast<int>(partition::ContextParallel::kGather),
             "internal error: context parallel method ", method);
  std::lock_guard<GraphLock> lock(GraphMutex());
  Options().context_parallel = static_cast<partition::ContextParallel>(method);
}

int ContextParallelMethod() {
  std::lock_guard<GraphLock> lock(GraphMutex());
  return static_cast<int>(Options().context_parallel);
}

std::pair<int64_t, int64_t> WindowedEinsum() {
  std::lock_guard<GraphLock> lock(GraphMutex());
  return {Options().windowed_einsum_bytes, Options().windowed_einsum_min_extent};
}

}  // namespace spmd::aten
