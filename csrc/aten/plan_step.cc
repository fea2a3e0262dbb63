#include "aten/plan_step.h"

#include <unordered_set>

#include "aten/step_memory.h"
#include "aten/step_program.h"
#include "core/metrics.h"
#include "plan/plan_cache.h"
#include "runtime/plan_mode.h"

namespace spmd::aten {

namespace {

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

}  // namespace

void PlanStep(const ir::Graph& graph, const std::vector<ir::Value>& outputs,
              const OutputSlots& slots_of) {
  auto& cache = plan::PlanCache::Get();
  const StepOptions step(graph);
  // Keyed as GetExecutable keys the compile cache.
  const Hash key = StepKey(graph, step);
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
  NoteStepStarted(planned);
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

}  // namespace spmd::aten
