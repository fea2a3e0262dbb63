#include "aten/sync.h"

#include <algorithm>
#include <unordered_map>

#include "core/metrics.h"
#include "partition/partitioner.h"
#include "runtime/compile_cache.h"

namespace spmd::aten {

namespace {

struct ValueHash {
  size_t operator()(const ir::Value& v) const {
    return std::hash<const void*>()(v.node.get()) ^ static_cast<size_t>(v.index);
  }
};

partition::ProgramStats& LastStats() {
  static auto* stats = new partition::ProgramStats();
  return *stats;
}

std::shared_ptr<runtime::Executable> GetExecutable(const ir::Graph& graph) {
  auto& cache = runtime::CompileCache::Get();
  if (auto exe = cache.Lookup(graph.key)) {
    Count("CachedCompile");
    return exe;
  }
  Count("UncachedCompile");
  ScopedTimer timer("CompileTime");
  auto exe = std::make_shared<runtime::Executable>(partition::PartitionGraph(graph, runtime::DeviceSet::Get().num_devices()));
  cache.Insert(graph.key, exe);
  return exe;
}

// The device data of a parameter, laid out as the program expects it.
runtime::DeviceDataPtr ParamData(const ir::NodePtr& param, const Sharding& expected) {
  auto data = std::static_pointer_cast<runtime::DeviceData>(param->data());
  bool have_replicated = data->is_replicated();
  bool want_replicated = !expected.valid() || expected.IsReplicated();
  if (have_replicated && want_replicated) return data;
  if (!want_replicated && data->sharding().valid() && data->sharding() == expected) return data;
  Count("ReshardParameters");
  return data->Relayout(expected);
}

// Input donation (XLA's input/output aliasing, for this runtime): a parameter of the graph
// that nothing can read after this run, typically the previous value of something updated in
// place (optimizer state, sharded parameters), gives its device memory back after its last use
// in the program rather than after the run, so the old and the new model state do not both
// peak at the end of a step. Unlike XLA, a failed run takes the memory back and the data is
// intact (see Executable::Run): a failed step leaves every tensor recomputable.
//
// "Nothing can read it" is decided from reference counts. Each graph node is held by
// graph.nodes, by graph.params (data nodes), by every input edge from a graph node, and, for
// the requested values, by `outputs`, graph.outputs, the slots_of keys and the synced slots
// (which get rebound to the results). A node with any other holder (a live tensor that is
// not synced here, a pending node outside the graph) may be evaluated again later, and with
// it every node it depends on: those parameters are kept.
std::vector<bool> DonatableParams(
    const ir::Graph& graph, const std::vector<ir::Value>& outputs,
    const std::unordered_map<ir::Value, std::vector<const SlotPtr*>, ValueHash>& slots_of) {
  std::unordered_map<const ir::Node*, long> internal;
  for (const ir::NodePtr& n : graph.nodes) {
    internal[n.get()] += n->is_data() ? 2 : 1;
    for (const ir::Value& in : n->inputs()) ++internal[in.node.get()];
  }
  for (const ir::Value& v : outputs) {
    // outputs, graph.outputs, the slots_of key, and each synced slot's value.
    internal[v.node.get()] += 3 + static_cast<long>(slots_of.at(v).size());
  }
  std::vector<const ir::Node*> stack;
  std::unordered_map<const ir::Node*, bool> reachable;
  for (const ir::NodePtr& n : graph.nodes)
    if (n.use_count() > internal[n.get()]) stack.push_back(n.get());
  while (!stack.empty()) {
    const ir::Node* n = stack.back();
    stack.pop_back();
    if (!reachable.emplace(n, true).second) continue;
    for (const ir::Value& in : n->inputs()) stack.push_back(in.node.get());
  }
  std::vector<bool> donated(graph.params.size(), false);
  for (size_t i = 0; i < graph.params.size(); ++i) {
    const ir::NodePtr& p = graph.params[i];
    donated[i] = !reachable.count(p.get()) && p->data().use_count() == 1;
  }
  return donated;
}

}  // namespace

void SyncSlots(const std::vector<SlotPtr>& slots) {
  std::lock_guard<std::recursive_mutex> lock(GraphMutex());
  std::vector<ir::Value> outputs;
  std::unordered_map<ir::Value, std::vector<const SlotPtr*>, ValueHash> slots_of;
  for (const SlotPtr& s : slots) {
    if (!s->value.valid() || s->value.node->is_data()) continue;
    auto& users = slots_of[s->value];
    if (users.empty()) outputs.push_back(s->value);
    users.push_back(&s);
  }
  if (outputs.empty()) return;

  ir::Graph graph = ir::BuildGraph(outputs);
  auto exe = GetExecutable(graph);
  const partition::Program& program = exe->program();
  std::vector<bool> donated = DonatableParams(graph, outputs, slots_of);
  std::vector<runtime::DeviceDataPtr> params;
  params.reserve(graph.params.size());
  for (size_t i = 0; i < graph.params.size(); ++i) {
    params.push_back(ParamData(graph.params[i], program.param_shardings[i]));
    // A relayout made a private copy for this run: always free it after its last use.
    if (params.back() != graph.params[i]->data()) donated[i] = true;
  }
  int64_t num_donated = std::count(donated.begin(), donated.end(), true);
  if (num_donated) Count("DonatedInputs", num_donated);

  std::vector<runtime::DeviceDataPtr> results;
  {
    ScopedTimer timer("ExecuteTime");
    results = exe->Run(params, graph.scalars, donated);
  }
  Count("ExecuteGraph");
  for (const auto& [op, count] : program.stats.replicated_fallback_ops) Count("ReplicatedFallback", count);
  LastStats() = program.stats;
  for (size_t i = 0; i < outputs.size(); ++i) {
    ir::NodePtr data_node = ir::MakeDataNode(results[i]);
    for (const SlotPtr* s : slots_of[outputs[i]]) SetSlotValue(*s, ir::Value{data_node, 0});
  }
}

void SyncAll() {
  std::lock_guard<std::recursive_mutex> lock(GraphMutex());
  SyncSlots(PendingSlots());
}

runtime::DeviceDataPtr Materialize(const SlotPtr& slot) {
  std::lock_guard<std::recursive_mutex> lock(GraphMutex());
  if (!slot->value.node->is_data()) SyncSlots({slot});
  return std::static_pointer_cast<runtime::DeviceData>(slot->value.node->data());
}

at::Tensor ToHost(const at::Tensor& t) {
  LazyImpl* impl = GetLazyImpl(t);
  return Materialize(impl->slot())->ToHost();
}

namespace {
std::vector<ir::Value> PendingValues(const std::vector<at::Tensor>& tensors) {
  std::vector<ir::Value> values;
  for (const at::Tensor& t : tensors) values.push_back(GetLazyImpl(t)->slot()->value);
  return values;
}
}  // namespace

std::string PendingGraphText(const std::vector<at::Tensor>& tensors) {
  std::lock_guard<std::recursive_mutex> lock(GraphMutex());
  return ir::GraphToText(ir::BuildGraph(PendingValues(tensors)));
}

std::string PartitionedProgramText(const std::vector<at::Tensor>& tensors) {
  std::lock_guard<std::recursive_mutex> lock(GraphMutex());
  return partition::PartitionGraph(ir::BuildGraph(PendingValues(tensors)), runtime::DeviceSet::Get().num_devices()).ToText();
}

partition::ProgramStats LastStepStats() {
  std::lock_guard<std::recursive_mutex> lock(GraphMutex());
  return LastStats();
}

}  // namespace spmd::aten
