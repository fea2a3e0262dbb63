#include "aten/debug_text.h"

#include "aten/auto_sharding.h"
#include "aten/lazy_tensor.h"
#include "aten/step_program.h"
#include "ir/graph.h"
#include "partition/partitioner.h"
#include "runtime/plan_mode.h"

namespace spmd::aten {

namespace {
std::vector<ir::Value> PendingValues(const std::vector<at::Tensor>& tensors) {
  std::vector<ir::Value> values;
  for (const at::Tensor& t : tensors) values.push_back(GetLazyImpl(t)->slot()->value);
  return values;
}
}  // namespace

Hash PendingGraphHash(const std::vector<at::Tensor>& tensors) {
  std::lock_guard<GraphLock> lock(GraphMutex());
  return HashCombine(ir::BuildGraph(PendingValues(tensors)).key,
                     AutoShardingKey());
}

std::string PendingGraphText(const std::vector<at::Tensor>& tensors) {
  std::lock_guard<GraphLock> lock(GraphMutex());
  return ir::GraphToText(ir::BuildGraph(PendingValues(tensors)));
}

std::vector<at::Tensor> PendingGraphParameters(const std::vector<at::Tensor>& tensors) {
  std::lock_guard<GraphLock> lock(GraphMutex());
  std::vector<at::Tensor> params;
  for (const ir::NodePtr& param : ir::BuildGraph(PendingValues(tensors)).params)
    params.push_back(MakeLazyTensor(ir::Value{param, 0}));
  return params;
}

int PendingGraphParameterIndex(const std::vector<at::Tensor>& params, const at::Tensor& t) {
  std::lock_guard<GraphLock> lock(GraphMutex());
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
  std::lock_guard<GraphLock> lock(GraphMutex());
  return partition::PartitionGraph(ir::BuildGraph(PendingValues(tensors)),
                                   runtime::GlobalDeviceCount(), Options())
      .ToText();
}

}  // namespace spmd::aten
