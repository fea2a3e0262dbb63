#include "aten/layout_search.h"

#include <numeric>
#include <optional>
#include <stdexcept>

#include "aten/lazy_tensor.h"
#include "ir/graph.h"
#include "plan/dim_classes.h"

namespace spmd::aten {

namespace {

// The graph of every pending value (none: nothing is pending). The caller holds GraphMutex.
std::optional<ir::Graph> PendingGraph() {
  std::vector<ir::Value> outputs;
  for (const SlotPtr& s : PendingSlots())
    if (s->value.valid() && !s->value.node->is_data()) outputs.push_back(s->value);
  if (outputs.empty()) return std::nullopt;
  return ir::BuildGraph(outputs);
}

int64_t IdOf(const ir::NodePtr& param) { return reinterpret_cast<int64_t>(param->data().get()); }

}  // namespace

int64_t DataId(const at::Tensor& t) {
  std::lock_guard<GraphLock> lock(GraphMutex());
  const ir::Value& v = GetLazyImpl(t, "data_id")->slot()->value;
  TORCH_CHECK(v.node->is_data(), "data_id: the tensor is pending; run mark_step() first");
  return IdOf(v.node);
}

std::unordered_map<int64_t, std::vector<int>> PendingDimClasses() {
  std::lock_guard<GraphLock> lock(GraphMutex());
  std::unordered_map<int64_t, std::vector<int>> out;
  std::optional<ir::Graph> graph = PendingGraph();
  if (!graph) return out;
  plan::DimClasses classes = plan::ComputeDimClasses(*graph);
  for (size_t i = 0; i < graph->params.size(); ++i) out[IdOf(graph->params[i])] = classes.param_dims[i];
  return out;
}

plan::LayoutCosts PendingLayoutCosts(const std::vector<int64_t>& mesh_shape,
                                          plan::LayoutProblem problem,
                                          const std::unordered_map<int64_t, int>& storage_of_data,
                                          const plan::Hardware& hw) {
  std::lock_guard<GraphLock> lock(GraphMutex());
  std::optional<ir::Graph> graph = PendingGraph();
  TORCH_CHECK(graph, "layout costs: nothing is pending; record the step first");
  problem.storage_of_param.clear();
  for (const ir::NodePtr& p : graph->params) {
    auto it = storage_of_data.find(IdOf(p));
    problem.storage_of_param.push_back(it == storage_of_data.end() ? -1 : it->second);
  }
  const int64_t n = std::accumulate(mesh_shape.begin(), mesh_shape.end(), int64_t{1},
                                    std::multiplies<int64_t>());
  std::vector<int64_t> ids(n);
  std::iota(ids.begin(), ids.end(), 0);
  try {
    const plan::DimClasses classes = plan::ComputeDimClasses(*graph);
    return plan::ComputeLayoutCosts(*graph, classes, plan::NodeRules(*graph),
                                         Mesh(ids, mesh_shape), hw, problem);
  } catch (const std::invalid_argument& e) {
    TORCH_CHECK_VALUE(false, e.what());
  }
}

}  // namespace spmd::aten
