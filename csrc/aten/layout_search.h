// What the auto-sharding search (torch_spmd/plan/auto_shard.py) reads of the pending step
// before planning any layout of it: which dims its data's layouts tie together, and the
// coefficients of the layout ILP. Nothing is computed or partitioned.
#pragma once
#include <ATen/ATen.h>

#include <cstdint>
#include <unordered_map>
#include <vector>

#include "plan/hardware.h"
#include "plan/layout_costs.h"

namespace spmd::aten {

// An identity for the device data `t` holds now (it must not be pending), stable while that
// data lives: what the functions below key data by.
int64_t DataId(const at::Tensor& t);

// The dim classes (plan/dim_classes.h) of the graph of everything pending, for each
// device data that graph reads, keyed by DataId.
std::unordered_map<int64_t, std::vector<int>> PendingDimClasses();

// The layout ILP's coefficients (plan/layout_costs.h) of the same graph on a mesh of
// `mesh_shape` (devices 0..n-1); the graph's parameters take their storage decision from
// `storage_of_data` (by DataId).
plan::LayoutCosts PendingLayoutCosts(const std::vector<int64_t>& mesh_shape,
                                          plan::LayoutProblem problem,
                                          const std::unordered_map<int64_t, int>& storage_of_data,
                                          const plan::Hardware& hw);

}  // namespace spmd::aten
