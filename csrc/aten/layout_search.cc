#include "aten/layout_search.h"

#include <numeric>
#include <optional>
#include <stdexcept>

#include "aten/lazy_tensor.h"
#include "ir/graph.h"
#include "partition/dim_classes.h"

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
  std::lock_guard<std::recursive_mutex> lock(GraphMutex());
  const ir::Value& v = GetLazyImpl(t, "data_id")->slot()->value;
  TORCH_CHECK(v.node->is_data(), "data_id: the tensor is pending; run mark_step() first");
  return IdOf(v.node);
}

std::unordered_map<int64_t, std::vector<int>> PendingDimClasses() {
  std::lock_guard<std::recursive_mutex> lock(GraphMutex());
  std::unordered_map<int64_t, std::vector<int>> out;
  std::optional<ir::Graph> graph = PendingGraph();
  if (!graph) return out;
  partition::DimClasses classes = partition::ComputeDimClasses(*graph);
  for (size_t i = 0; i < graph->params.size(); ++i) out[IdOf(graph->params[i])] = classes.param_dims[i];
  return out;
}

std::vector<partition::LayoutCosts> PendingLayoutCosts(
    const std::vector<std::vector<int64_t>>& mesh_shapes,
    std::vector<partition::LayoutProblem> problems,
    const std::unordered_map<int64_t, int>& storage_of_data, const partition::Hardware& hw) {
  TORCH_CHECK(mesh_shapes.size() == problems.size(), "layout costs: ", mesh_shapes.size(),
              " mesh shapes but ", problems.size(), " problems");
  std::lock_guard<std::recursive_mutex> lock(GraphMutex());
  std::vector<partition::LayoutCosts> out;
  std::optional<ir::Graph> graph = PendingGraph();
  TORCH_CHECK(graph, "layout costs: nothing is pending; record the step first");
  partition::DimClasses classes = partition::ComputeDimClasses(*graph);
  const partition::NodeRules rules(*graph);
  std::vector<int> storage;
  for (const ir::NodePtr& p : graph->params) {
    auto it = storage_of_data.find(IdOf(p));
    storage.push_back(it == storage_of_data.end() ? -1 : it->second);
  }
  for (size_t s = 0; s < mesh_shapes.size(); ++s) {
    const int64_t n = std::accumulate(mesh_shapes[s].begin(), mesh_shapes[s].end(), int64_t{1},
                                      std::multiplies<int64_t>());
    std::vector<int64_t> ids(n);
    std::iota(ids.begin(), ids.end(), 0);
    std::vector<std::string> names;
    for (size_t a = 0; a < mesh_shapes[s].size(); ++a) names.push_back("axis" + std::to_string(a));
    problems[s].storage_of_param = storage;
    try {
      out.push_back(partition::ComputeLayoutCosts(*graph, classes, rules, Mesh(ids, mesh_shapes[s], names),
                                                  hw, problems[s]));
    } catch (const std::invalid_argument& e) {
      TORCH_CHECK_VALUE(false, e.what());
    }
  }
  return out;
}

}  // namespace spmd::aten
