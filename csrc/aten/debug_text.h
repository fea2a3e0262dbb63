// The pending graph of some tensors and its partitioned program, as keys and text, without
// executing anything (PyTorch/XLA's debugging helpers).
#pragma once
#include <ATen/Tensor.h>

#include <string>
#include <vector>

#include "core/hash.h"

namespace spmd::aten {

// The key of the graph computing `tensors` (with auto-sharding's part, AutoShardingKey):
// PyTorch/XLA's _XLAC._get_graph_hash.
Hash PendingGraphHash(const std::vector<at::Tensor>& tensors);
// The graph (global IR) and the partitioned program of the given tensors' pending values, as
// text, without executing anything.
std::string PendingGraphText(const std::vector<at::Tensor>& tensors);
// The device data that graph reads (its parameters, in the graph's order), as tensors sharing
// it; and the index among `params` of the data `t` holds (-1: none, or `t` is pending).
std::vector<at::Tensor> PendingGraphParameters(const std::vector<at::Tensor>& tensors);
int PendingGraphParameterIndex(const std::vector<at::Tensor>& params, const at::Tensor& t);
std::string PartitionedProgramText(const std::vector<at::Tensor>& tensors);

}  // namespace spmd::aten
