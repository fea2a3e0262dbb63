#include "aten/sync.h"

#include <algorithm>
#include <unordered_map>
#include <unordered_set>

#include "aten/donation.h"
#include "aten/graph_template.h"
#include "aten/plan_step.h"
#include "aten/step_memory.h"
#include "aten/step_program.h"
#include "core/metrics.h"
#include "ir/internal_ops.h"
#include "partition/rules/rule.h"
#include "runtime/error_message.h"
#include "runtime/plan_mode.h"
#include "runtime/world_health.h"

namespace spmd::aten {

namespace {

// A value v and its annotated form constraint(v) both requested (an in-place update gives the
// updated tensor's slot constraint(v) to keep its annotation, while another tensor sharing the
// storage, e.g. functionalization's base, still points at v) are the same values: both slots
// get the annotated result instead of v being materialised a second time.
void MergeAnnotatedCopies(
    std::vector<ir::Value>& outputs,
    OutputSlots& slots_of) {
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
    return rule && rule->executor.view != partition::ViewKind::kNone;
  };
  std::vector<SlotPtr> slots = requested;
  for (SlotPtr& s : others)
    if (reads.at(s->value.node.get()) && !is_view(*s->value.node)) slots.push_back(std::move(s));
  return slots;
}

}  // namespace

void SyncSlots(const std::vector<SlotPtr>& requested) {
  std::lock_guard<GraphLock> lock(GraphMutex());
  const std::vector<SlotPtr> slots = WithValuesComputedAlong(requested);
  std::vector<ir::Value> outputs;
  OutputSlots slots_of;
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
  NoteStepStarted(std::shared_ptr<const partition::Program>(exe, &exe->program()));
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
    try {
      results = exe->Run(params, graph.scalars, donated);
    } catch (const std::exception& e) {
      // The other processes of a multi-process world would wait for this one: they abort.
      if (!runtime::WorldHealth::Aborted())
        runtime::WorldHealth::PostFailure(runtime::UserMessage(e));
      throw;
    }
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
  std::lock_guard<GraphLock> lock(GraphMutex());
  SyncSlots(PendingSlots());
}

runtime::DeviceDataPtr Materialize(const SlotPtr& slot) {
  std::lock_guard<GraphLock> lock(GraphMutex());
  NoteHostWork();  // (its callers read the data: a template would freeze it)
  if (!slot->value.node->is_data()) SyncSlots({slot});
  return std::static_pointer_cast<runtime::DeviceData>(slot->value.node->data());
}

at::Tensor ToHost(const at::Tensor& t) {
  LazyImpl* impl = GetLazyImpl(t);
  return Materialize(impl->slot())->ToHost();
}

}  // namespace spmd::aten
