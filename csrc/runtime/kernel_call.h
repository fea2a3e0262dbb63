// One kernel call of an instruction: its prebuilt stack filled with this call's tensors and
// run-time scalars, random ops reseeded per tile (so a sharded random op draws per tile what
// it would draw unsharded at tile 0), the returns flattened into the node's outputs.
#pragma once
#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

#include "ir/op.h"
#include "runtime/execution_plan.h"

namespace spmd::runtime {

// One kernel call on `args` (one tensor per node input): the results, one per node output
// (undefined where the program expects none). Written inputs are cloned first (values are
// immutable). `tile` reseeds a random op's draws; `as_view` calls the instruction's view
// kernel instead of its op's.
std::vector<at::Tensor> CallKernel(const Instruction& ins, std::vector<at::Tensor> args,
                                   const std::vector<ir::ScalarValue>& scalars, int64_t tile,
                                   bool as_view = false);

}  // namespace spmd::runtime
