#include "aten/sync.h"

#include <algorithm>
#include <optional>
#include <unordered_map>
#include <unordered_set>

#include "aten/auto_sharding.h"
#include "aten/graph_template.h"
#include "core/metrics.h"
#include "ir/internal_ops.h"
#include "partition/cost.h"
#include "partition/partitioner.h"
#include "partition/rules/rule.h"
#include "plan/caching_allocator.h"
#include "plan/plan_cache.h"
#include "runtime/compile_cache.h"
#include "runtime/plan_mode.h"
#include "runtime/process_span.h"

namespace spmd::aten {

namespace {

using ir::ValueHash;

partition::PartitionOptions& Options() {
  static auto* options = new partition::PartitionOptions();
  return *options;
}

// The options a step's graph is partitioned with, and their part of its compile key: the
// session's, and under auto-sharding the layouts chosen for its unannotated parameters.
struct StepOptions {
  partition::PartitionOptions options = Options();
  std::optional<AutoLayouts> auto_layouts;
  Hash key = 0;

  explicit StepOptions(const ir::Graph& graph) {
    auto_layouts = AutoLayoutsFor(graph, runtime::GlobalDeviceCount(),
                                  runtime::Planning(), options.defer_output_reductions);
    key = options.Key();
    if (auto_layouts) {
      options.param_layouts = &auto_layouts->layouts;
      key = HashCombine(key, auto_layouts->key);
    }
  }
  StepOptions(const StepOptions&) = delete;  // (options points into auto_layouts)
};

std::shared_ptr<runtime::Executable> GetExecutable(const ir::Graph& graph) {
  auto& cache = runtime::CompileCache::Get();
  const StepOptions step(graph);
  // (The device count too: an unannotated graph is the same graph on any device set.)
  const Hash key = HashCombine(HashCombine(graph.key, step.key),
                               HashInt(runtime::GlobalDeviceCount()));
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

// Whether a parameter's data must be relaid out (through a private copy) for the program.
bool NeedsRelayout(const ir::NodePtr& param, const Sharding& expected) {
  auto data = std::static_pointer_cast<runtime::DeviceData>(param->data());
  bool want_replicated = !expected.valid() || expected.IsReplicated();
  if (data->is_replicated() && want_replicated) return false;
  return want_replicated || !data->sharding().valid() || data->sharding() != expected;
}

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
    // outputs, graph.outputs, the slots_of key, and each synced slot's value (which may be
    // the input of v, see MergeAnnotatedCopies).
    internal[v.node.get()] += 3;
    for (const SlotPtr* s : slots_of.at(v)) ++internal[(*s)->value.node.get()];
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

// Bytes each device holds in the data of live tensors (each data counted once, whether
// planned or real): what stays resident between steps.
// `skip`: data not to count (a step's own parameters).
int64_t ResidentBytesPerDevice(std::unordered_set<const ir::DataHandle*> skip = {}) {
  int64_t bytes = 0;
  for (const SlotPtr& s : LiveSlots()) {
    if (!s->value.valid() || !s->value.node->is_data()) continue;
    const ir::DataHandle* data = s->value.node->data().get();
    if (!skip.insert(data).second) continue;
    bytes += static_cast<const runtime::DeviceData*>(data)->BytesPerDevice();
  }
  return bytes;
}

// Bytes of live tensors a step does not read, which stay on the devices while it runs.
int64_t BytesBesideStep(const ir::Graph& graph) {
  std::unordered_set<const ir::DataHandle*> params;
  for (const ir::NodePtr& p : graph.params) params.insert(p->data().get());
  return ResidentBytesPerDevice(std::move(params));
}

// A value v and its annotated form constraint(v) both requested (an in-place update gives the
// updated tensor's slot constraint(v) to keep its annotation, while another tensor sharing the
// storage, e.g. functionalization's base, still points at v) are the same values: both slots
// get the annotated result instead of v being materialised a second time.
void MergeAnnotatedCopies(
    std::vector<ir::Value>& outputs,
    std::unordered_map<ir::Value, std::vector<const SlotPtr*>, ValueHash>& slots_of) {
  const ir::OpInfo* constraint = ir::InternalOps::Get().sharding_constraint;
  std::vector<ir::Value> merged;
  for (const ir::Value& out : outputs) {
    if (out.node->op() != constraint) continue;
    const ir::Value& in = out.node->input(0);
    auto it = slots_of.find(in);
    if (it == slots_of.end()) continue;
    auto& users = slots_of[out];
    users.insert(users.end(), it->second.begin(), it->second.end());
    slots_of.erase(it);
    merged.push_back(in);
  }
  if (merged.empty()) return;
  outputs.erase(std::remove_if(outputs.begin(), outputs.end(),
                               [&](const ir::Value& v) {
                                 return std::find(merged.begin(), merged.end(), v) != merged.end();
                               }),
                outputs.end());
}

// The last step (run or planned) and what its memory figures need. The figures themselves
// (a liveness pass over the program) are computed when first asked for, not on every step;
// what depends on the moment (the bytes of live tensors) is taken when the step runs.
struct LastStep {
  std::shared_ptr<const partition::Program> program;  // of the last step started
  std::shared_ptr<const partition::Program> done;     // of the last step that completed
  std::vector<bool> donated;  // parameters `done` freed after their last use
  int64_t beside = 0;         // bytes of live tensors the step does not read
  int64_t resident = 0;       // bytes of live tensors after the step
  std::optional<partition::ProgramStats> stats;
};
LastStep& Last() {
  static auto* last = new LastStep();
  return *last;
}

void RecordStep(std::shared_ptr<const partition::Program> program, std::vector<bool> donated,
                int64_t beside) {
  LastStep& last = Last();
  last.done = std::move(program);
  last.donated = std::move(donated);
  last.beside = beside;
  last.resident = ResidentBytesPerDevice();
  last.stats.reset();
}

// The step's statistics, with the parameters it donates freed after their last use (a
// program's own peak_bytes_per_device assumes none is).
partition::ProgramStats StepStats(const LastStep& last) {
  if (!last.done) return {};
  const partition::Program& program = *last.done;
  partition::ProgramStats stats = program.stats;
  int64_t at = 0;
  stats.peak_bytes_per_device = partition::PeakBytesPerDevice(program, &at, &last.donated);
  if (!program.nodes.empty()) stats.peak_op = program.nodes[at]->op()->qualified;
  stats.resident_bytes_per_device = last.resident;
  stats.device_peak_bytes = last.beside + stats.peak_bytes_per_device;
  stats.reserved_bytes_per_device =
      plan::ReservedPeakPerDevice(program, last.beside, &last.donated);
  return stats;
}

// The mesh a sharding constraint tiles over, or null. (Parameters on another mesh than the
// program's are relaid out on the host before the run; constraints cannot be.)
const Mesh* TiledMeshOf(const ir::Node& n) {
  if (n.op() != ir::InternalOps::Get().sharding_constraint) return nullptr;
  const Sharding& s = n.shardings().at(0);
  return s.IsReplicated() || s.is_manual() ? nullptr : &s.mesh();
}

// A program runs on one mesh. Values annotated on different meshes (unrelated tensors marked
// with meshes of different shapes) are synced as separate programs, one per group of connected
// values; values on different meshes that meet in one computation are an error. Returns the
// outputs grouped that way (one group when a single mesh, or none, is involved).
std::vector<std::vector<ir::Value>> GroupOutputsByMesh(const ir::Graph& graph) {
  std::vector<const Mesh*> meshes;
  for (const ir::NodePtr& n : graph.nodes)
    if (const Mesh* m = TiledMeshOf(*n))
      if (std::none_of(meshes.begin(), meshes.end(), [&](const Mesh* o) { return *o == *m; }))
        meshes.push_back(m);
  if (meshes.size() <= 1) return {graph.outputs};
  // Connected components over the graph's edges (union-find on node positions).
  std::vector<int> parent(graph.nodes.size());
  for (size_t i = 0; i < parent.size(); ++i) parent[i] = static_cast<int>(i);
  auto find = [&](int x) {
    while (parent[x] != x) x = parent[x] = parent[parent[x]];
    return x;
  };
  for (size_t i = 0; i < graph.nodes.size(); ++i)
    for (const ir::Value& in : graph.nodes[i]->inputs())
      parent[find(graph.PositionOf(in.node.get()))] = find(static_cast<int>(i));
  std::unordered_map<int, const Mesh*> mesh_of;  // component -> its mesh
  for (size_t i = 0; i < graph.nodes.size(); ++i) {
    const Mesh* m = TiledMeshOf(*graph.nodes[i]);
    if (!m) continue;
    auto [it, fresh] = mesh_of.emplace(find(static_cast<int>(i)), m);
    TORCH_CHECK(fresh || *it->second == *m,
                "one computation constrains values to shardings on different meshes: ",
                it->second->ToString(), " and ", m->ToString(),
                "; annotate the values it computes with one mesh");
  }
  // One group per mesh (components without an annotation join the first group).
  std::vector<std::vector<ir::Value>> groups(meshes.size());
  for (const ir::Value& out : graph.outputs) {
    auto it = mesh_of.find(find(graph.PositionOf(out.node.get())));
    size_t g = 0;
    if (it != mesh_of.end())
      while (!(*meshes[g] == *it->second)) ++g;
    groups[g].push_back(out);
  }
  groups.erase(std::remove_if(groups.begin(), groups.end(),
                              [](const std::vector<ir::Value>& g) { return g.empty(); }),
               groups.end());
  return groups;
}

// The parameters of `graph` laid out as `program` expects them. One relaid out is a private
// copy for this run: it is marked donated, freed after its last use.
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

// Plan mode keeps the values of integer and boolean outputs (DeviceData::KeepsKnownValue)
// that are computed without random numbers from factories and known data: the masks,
// positions and ids that Python code reads to decide what to run (Hugging Face's mask code
// reads `.all()` of one). Per output, its value on the host, or an undefined tensor; empty
// when there is none. They are computed by a real step of just those outputs, whose every
// intermediate value is at most kKnownValueBytes.
std::vector<at::Tensor> KnownValues(const ir::Graph& graph, const std::vector<ir::Value>& outputs) {
  using runtime::DeviceData;
  std::unordered_set<const ir::Node*> computable;
  for (const ir::NodePtr& n : graph.nodes) {
    bool ok = true;
    if (n->is_data()) {
      const auto* data = static_cast<const DeviceData*>(n->data().get());
      ok = !data->planned() || data->known();
    } else {
      ok = !n->draws_random_numbers();
      for (const TensorType& t : n->outputs()) ok = ok && t.bytes() <= DeviceData::kKnownValueBytes;
      for (const ir::Value& in : n->inputs()) ok = ok && computable.count(in.node.get());
    }
    if (ok) computable.insert(n.get());
  }
  std::vector<ir::Value> wanted;
  std::vector<size_t> position;
  for (size_t i = 0; i < outputs.size(); ++i) {
    if (!computable.count(outputs[i].node.get()) ||
        !DeviceData::KeepsKnownValue(outputs[i].type()))
      continue;
    wanted.push_back(outputs[i]);
    position.push_back(i);
  }
  if (wanted.empty()) return {};
  Count("PlanKnownValues", static_cast<int64_t>(wanted.size()));
  runtime::PlanningPaused real;
  try {
    ir::Graph sub = ir::BuildGraph(wanted);
    auto exe = GetExecutable(sub);
    std::vector<bool> donated(sub.params.size(), false);
    std::vector<runtime::DeviceDataPtr> params = ProgramParams(sub, exe->program(), donated);
    std::vector<runtime::DeviceDataPtr> results = exe->Run(params, sub.scalars, donated);
    std::vector<at::Tensor> known(outputs.size());
    for (size_t w = 0; w < wanted.size(); ++w) known[position[w]] = results[w]->ToHost().clone();
    return known;
  } catch (const std::exception&) {
    // Knowing them is a convenience: values that cannot be computed (an op that fails on this
    // data) stay unknown, and reading them raises the usual "holds no data".
    Count("PlanKnownValuesFailed");
    return {};
  }
}

// Plan mode: the step is partitioned (and cached) like a real one, then analysed instead of
// run; its outputs become planned data in the layouts the program produces them in (with
// their values where KnownValues keeps them).
void PlanStep(const ir::Graph& graph, const std::vector<ir::Value>& outputs,
              const std::unordered_map<ir::Value, std::vector<const SlotPtr*>, ValueHash>& slots_of) {
  auto& cache = plan::PlanCache::Get();
  const StepOptions step(graph);
  // Keyed as GetExecutable keys the compile cache.
  const Hash key = HashCombine(HashCombine(graph.key, step.key),
                               HashInt(runtime::GlobalDeviceCount()));
  std::shared_ptr<const partition::Program> planned = cache.Lookup(key);
  if (planned) {
    Count("CachedCompile");
  } else {
    Count("UncachedCompile");
    ScopedTimer timer("CompileTime");
    cache.MakeRoom(graph.nodes.size());
    partition::PartitionOptions options = step.options;
    options.executor_traits = false;  // (never run)
    planned = std::make_shared<const partition::Program>(
        partition::PartitionGraph(graph, runtime::GlobalDeviceCount(), options));
    cache.Insert(key, planned);
  }
  const partition::Program& program = *planned;
  Last().program = planned;
  Count("PlanGraph");
  const int64_t beside = BytesBesideStep(graph);
  // Donated as a run would donate them (SyncSlots): unreachable after the step, or relaid out.
  std::vector<bool> donated = DonatableParams(graph, outputs, slots_of);
  for (size_t i = 0; i < graph.params.size(); ++i)
    if (NeedsRelayout(graph.params[i], program.param_shardings[i])) donated[i] = true;
  const std::vector<at::Tensor> known = KnownValues(graph, outputs);
  for (size_t i = 0; i < outputs.size(); ++i) {
    ir::NodePtr data_node = ir::MakeDataNode(runtime::DeviceData::Planned(
        program.output_global_types[i], program.output_shardings[i],
        known.empty() ? at::Tensor() : known[i]));
    for (const SlotPtr* s : slots_of.at(outputs[i])) SetSlotValue(*s, ir::Value{data_node, 0});
  }
  RecordStep(planned, std::move(donated), beside);
}

}  // namespace

namespace {

// `requested`, and every other live tensor whose pending value depends on what the step
// computes for them (a read of one value computes everything it depends on). Those are
// synced along: later steps start from data instead of computing the shared part again, and
// the pending graph does not grow. A generation loop reads one flag per token; the KV cache,
// the token ids, the attention mask and the positions that the token's forward uses and
// updates become data, so every token runs a graph of the same size (the same graph, a
// compile-cache hit, with a static cache) instead of one that grows with each token.
std::vector<SlotPtr> WithValuesComputedAlong(const std::vector<SlotPtr>& requested) {
  std::unordered_map<const ir::Node*, bool> reads;  // whether a node reads what they compute
  std::vector<const ir::Node*> stack;
  std::unordered_set<const LazySlot*> included;
  for (const SlotPtr& s : requested) {
    included.insert(s.get());
    if (s->value.valid() && !s->value.node->is_data()) stack.push_back(s->value.node.get());
  }
  if (stack.empty()) return requested;
  std::vector<SlotPtr> others;  // pending, not requested
  for (SlotPtr& s : PendingSlots())
    if (!included.count(s.get())) others.push_back(std::move(s));
  if (others.empty()) return requested;  // mark_step: everything pending is requested
  while (!stack.empty()) {  // what the requested values compute
    const ir::Node* n = stack.back();
    stack.pop_back();
    if (n->is_data() || !reads.emplace(n, true).second) continue;
    for (const ir::Value& in : n->inputs()) stack.push_back(in.node.get());
  }
  // The other pending nodes, each decided once after its inputs (an iterative post-order: a
  // pending chain can be deep).
  std::vector<std::pair<const ir::Node*, bool>> walk;  // (node, its inputs decided)
  for (const SlotPtr& s : others) walk.emplace_back(s->value.node.get(), false);
  while (!walk.empty()) {
    auto [n, inputs_decided] = walk.back();
    walk.pop_back();
    if (inputs_decided) {
      bool r = false;
      for (const ir::Value& in : n->inputs()) r = r || (!in.node->is_data() && reads.at(in.node.get()));
      reads[n] = r;
    } else if (!n->is_data() && !reads.count(n)) {
      walk.emplace_back(n, true);
      for (const ir::Value& in : n->inputs())
        if (!in.node->is_data() && !reads.count(in.node.get())) walk.emplace_back(in.node.get(), false);
    }
  }
  // Views are left pending: taking one again costs nothing, and a view made an output is
  // copied out contiguous where its readers in the step read it strided (runtime/
  // executable.cc), so a matmul reading a transposed weight that autograd saved would round
  // differently from eager.
  auto is_view = [](const ir::Node& n) {
    partition::RulePtr rule = partition::GetRule(n);
    return rule && rule->view != partition::ViewKind::kNone;
  };
  std::vector<SlotPtr> slots = requested;
  for (SlotPtr& s : others)
    if (reads.at(s->value.node.get()) && !is_view(*s->value.node)) slots.push_back(std::move(s));
  return slots;
}

}  // namespace

void SyncSlots(const std::vector<SlotPtr>& requested) {
  std::lock_guard<std::recursive_mutex> lock(GraphMutex());
  const std::vector<SlotPtr> slots = WithValuesComputedAlong(requested);
  std::vector<ir::Value> outputs;
  std::unordered_map<ir::Value, std::vector<const SlotPtr*>, ValueHash> slots_of;
  for (const SlotPtr& s : slots) {
    if (!s->value.valid() || s->value.node->is_data()) continue;
    auto& users = slots_of[s->value];
    if (users.empty()) outputs.push_back(s->value);
    users.push_back(&s);
  }
  if (outputs.empty()) return;
  NoteHostWork();
  MergeAnnotatedCopies(outputs, slots_of);

  ir::Graph graph = ir::BuildGraph(outputs);
  // (Scoped to the if: the groups' Values hold the output nodes, which DonatableParams counts.)
  if (std::vector<std::vector<ir::Value>> groups = GroupOutputsByMesh(graph); groups.size() > 1) {
    for (const std::vector<ir::Value>& group : groups) {
      std::vector<SlotPtr> group_slots;
      for (const ir::Value& v : group)
        for (const SlotPtr* s : slots_of.at(v)) group_slots.push_back(*s);
      SyncSlots(group_slots);
    }
    return;
  }
  if (runtime::Planning()) return PlanStep(graph, outputs, slots_of);
  for (const ir::NodePtr& p : graph.params) {
    const auto* data = static_cast<const runtime::DeviceData*>(p->data().get());
    if (data->planned() && !data->known()) throw runtime::PlannedDataError("run a step that reads it");
  }
  auto exe = GetExecutable(graph);
  const partition::Program& program = exe->program();
  Last().program = std::shared_ptr<const partition::Program>(exe, &exe->program());
  std::vector<bool> donated = DonatableParams(graph, outputs, slots_of);
  std::vector<runtime::DeviceDataPtr> params = ProgramParams(graph, program, donated);
  int64_t num_donated = std::count(donated.begin(), donated.end(), true);
  if (num_donated) {
    Count("DonatedInputs", num_donated);
    // Per run that donates: how many inputs (PyTorch/XLA's metric of the same name counts the
    // input/output aliases of each program).
    Metrics::Get().Record("InputOutputAliasCount", static_cast<double>(num_donated));
  }

  const int64_t beside = BytesBesideStep(graph);
  std::vector<runtime::DeviceDataPtr> results;
  {
    ScopedTimer timer("ExecuteTime");
    results = exe->Run(params, graph.scalars, donated);
  }
  Count("ExecuteGraph");
  for (const auto& [op, count] : program.stats.replicated_fallback_ops) Count("ReplicatedFallback", count);
  for (size_t i = 0; i < outputs.size(); ++i) {
    ir::NodePtr data_node = ir::MakeDataNode(results[i]);
    for (const SlotPtr* s : slots_of[outputs[i]]) SetSlotValue(*s, ir::Value{data_node, 0});
  }
  RecordStep(std::shared_ptr<const partition::Program>(exe, &program), std::move(donated),
             beside);
}

void SyncAll() {
  std::lock_guard<std::recursive_mutex> lock(GraphMutex());
  SyncSlots(PendingSlots());
}

runtime::DeviceDataPtr Materialize(const SlotPtr& slot) {
  std::lock_guard<std::recursive_mutex> lock(GraphMutex());
  NoteHostWork();  // (its callers read the data: a template would freeze it)
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

Hash PendingGraphHash(const std::vector<at::Tensor>& tensors) {
  std::lock_guard<std::recursive_mutex> lock(GraphMutex());
  return HashCombine(ir::BuildGraph(PendingValues(tensors)).key,
                     AutoShardingKey());
}

std::string PendingGraphText(const std::vector<at::Tensor>& tensors) {
  std::lock_guard<std::recursive_mutex> lock(GraphMutex());
  return ir::GraphToText(ir::BuildGraph(PendingValues(tensors)));
}

std::vector<at::Tensor> PendingGraphParameters(const std::vector<at::Tensor>& tensors) {
  std::lock_guard<std::recursive_mutex> lock(GraphMutex());
  std::vector<at::Tensor> params;
  for (const ir::NodePtr& param : ir::BuildGraph(PendingValues(tensors)).params)
    params.push_back(MakeLazyTensor(ir::Value{param, 0}));
  return params;
}

int PendingGraphParameterIndex(const std::vector<at::Tensor>& params, const at::Tensor& t) {
  std::lock_guard<std::recursive_mutex> lock(GraphMutex());
  auto data_of = [](const at::Tensor& x) -> const ir::DataHandle* {
    return GetLazyImpl(x, "a graph parameter")->slot()->value.node->data().get();
  };
  const ir::DataHandle* data = data_of(t);
  if (!data) return -1;
  for (size_t i = 0; i < params.size(); ++i)
    if (data_of(params[i]) == data) return static_cast<int>(i);
  return -1;
}

std::string PartitionedProgramText(const std::vector<at::Tensor>& tensors) {
  std::lock_guard<std::recursive_mutex> lock(GraphMutex());
  return partition::PartitionGraph(ir::BuildGraph(PendingValues(tensors)),
                                   runtime::GlobalDeviceCount(), Options())
      .ToText();
}

void SetDeferOutputReductions(bool defer) {
  std::lock_guard<std::recursive_mutex> lock(GraphMutex());
  Options().defer_output_reductions = defer;
}

bool DeferOutputReductions() {
  std::lock_guard<std::recursive_mutex> lock(GraphMutex());
  return Options().defer_output_reductions;
}

void SetWindowedEinsum(int64_t bytes, int64_t min_step_extent) {
  std::lock_guard<std::recursive_mutex> lock(GraphMutex());
  Options().windowed_einsum_bytes = bytes < 0 ? -1 : bytes;
  Options().windowed_einsum_min_extent = std::max<int64_t>(min_step_extent, 1);
}

void SetFusedMemory(bool on) {
  std::lock_guard<std::recursive_mutex> lock(GraphMutex());
  Options().fused_memory = on;
}

bool FusedMemory() {
  std::lock_guard<std::recursive_mutex> lock(GraphMutex());
  return Options().fused_memory;
}

std::pair<int64_t, int64_t> WindowedEinsum() {
  std::lock_guard<std::recursive_mutex> lock(GraphMutex());
  return {Options().windowed_einsum_bytes, Options().windowed_einsum_min_extent};
}

std::shared_ptr<const partition::Program> LastProgram() {
  std::lock_guard<std::recursive_mutex> lock(GraphMutex());
  return Last().program;
}

std::vector<bool> LastDonated() {
  std::lock_guard<std::recursive_mutex> lock(GraphMutex());
  return Last().donated;
}

partition::ProgramStats LastStepStats() {
  std::lock_guard<std::recursive_mutex> lock(GraphMutex());
  LastStep& last = Last();
  if (!last.stats) last.stats = StepStats(last);
  return *last.stats;
}

}  // namespace spmd::aten
