// Layouts for a step's parameters chosen by the cost model: what PyTorch/XLA's
// use_spmd(auto=True) (XLA's auto-sharding pass) does for a script that annotates nothing.
//
// The decisions are the graph's dim classes (dim_classes.h): every dim of one class gets the
// same ordered tuple of mesh axes, or none, so each op tying those dims runs where its data
// lies. A parameter's layout is its dims' classes' axes; a candidate that would use an axis
// twice on one parameter is not one. Each candidate is partitioned for real, with the layouts
// assumed (PartitionOptions::param_layouts: no data moves), and priced by the cost model, so
// its step time and peak are those plan mode reports. The search is a coordinate descent from
// the layout the script gave (every decided parameter replicated): one class at a time takes
// each of its options, and a change that ranks better (fits the memory budget, then a shorter
// step) is kept, until a sweep changes nothing or the evaluations run out.
// (torch_spmd/plan/auto_shard.py searches a wider space, storage included, over mesh shapes,
// re-running the user's step function; this one needs only the recorded graph.)
#pragma once
#include <vector>

#include "ir/graph.h"
#include "partition/propagate.h"
#include "plan/hardware.h"

namespace spmd::plan {

// The compiler's types this floor reads.
using partition::ParamLayouts;

struct AutoLayoutRequest {
  MeshPtr mesh;
  Hardware hardware;
  int64_t memory_budget = 0;  // bytes per device a layout may peak at; 0: no limit
  std::vector<bool> decide;   // per graph parameter: choose its layout (else it is kept)
  bool defer_output_reductions = false;  // the session's partitioning option
  int max_evaluations = 200;
};

struct AutoLayout {
  ParamLayouts layouts;  // the decided parameters' chosen layouts, keyed by their data
  double step_seconds = 0;
  int64_t peak_bytes = 0;
  bool fits = true;
  int evaluations = 0;
};

AutoLayout ChooseParamLayouts(const ir::Graph& graph, const AutoLayoutRequest& request);

}  // namespace spmd::plan
