// Plan mode's step: the graph partitioned (and cached) as a run would be, then analysed
// instead of run.
#pragma once
#include <vector>

#include "aten/donation.h"
#include "ir/graph.h"

namespace spmd::aten {

// Plan mode: the step is partitioned (and cached) like a real one, then analysed instead of
// run; its outputs become planned data in the layouts the program produces them in (with
// their values where KnownValues keeps them).
void PlanStep(const ir::Graph& graph, const std::vector<ir::Value>& outputs,
              const OutputSlots& slots_of);

}  // namespace spmd::aten
