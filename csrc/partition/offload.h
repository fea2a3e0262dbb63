// Host offloading (XLA's host memory space, PyTorch's save_on_cpu, MaxText's offloaded remat
// policies): a value the user marks to be kept in host memory (spmd::offload with to_host,
// ir/internal_ops.h) is read by its forward readers from device memory as it is, and by its
// backward readers (ir::Node::in_backward) from a copy moved to its devices' hosts as soon as
// it is made (spmd::place_to_host) and moved back right before the first of them
// (spmd::place_to_device): one copy each way per value, however many marks it has (autograd
// saves a tensor once per op that reads it). In between it holds no device memory
// (partition/cost.h) and its bytes cross the host link twice (plan/collective_model.h),
// on streams of their own (plan/step_schedule.h). A mark without backward readers, a mark
// with to_host 0 (a checkpoint name to save, not to offload) and a mark of the step's input
// data (a parameter, which stays in device memory anyway) are identities and vanish.
#pragma once
#include "ir/graph.h"

namespace spmd::partition {

// `graph` with its offload marks so placed; `graph` itself when it has none.
ir::Graph PlaceOffloaded(const ir::Graph& graph);

}  // namespace spmd::partition
