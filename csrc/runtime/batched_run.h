// How one ATen op runs over the rows of its stacked inputs (stacked.h): in one call where it
// can (elementwise on the stacked rows, with rows merged into one of its dims, or under vmap)
// and once per distinct row where it cannot. The executable picks among these per instruction
// (executable.h); these functions read only the instruction and its inputs.
#pragma once
#include <ATen/ATen.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "runtime/execution_plan.h"
#include "runtime/stacked.h"

namespace spmd::runtime {

// The inputs of one ATen op aligned to one row map: see Align.
struct AlignedInputs {
  RowMapPtr map;
  std::vector<int64_t> first_device;  // per row, a device holding it (when regrouped)
  std::vector<at::Tensor> rows;       // per input: [rows, ...] if batched, else its one shard
  std::vector<bool> batched;
};

// The inputs on one row map: theirs where every input that varies shares one, else one row
// per distinct combination of the inputs' rows (and of `tiles`, a device's tile per device,
// where a random op draws per tile).
AlignedInputs Align(const std::vector<const Stacked*>& inputs, const std::vector<int64_t>* tiles);

// Runs an op whose inputs vary over devices in one call, stacked: elementwise, with rows
// merged into dims, or under vmap. nullopt: it must run per row (no batching rule).
std::optional<std::vector<Stacked>> RunBatched(const Instruction& ins,
                                               const std::vector<const Stacked*>& inputs,
                                               const std::vector<ir::ScalarValue>& scalars);

// The op once per row of `a` (a random op reseeded with each row's tile from `tiles`).
std::vector<Stacked> RunPerRow(const Instruction& ins, const AlignedInputs& a,
                               const std::vector<ir::ScalarValue>& scalars,
                               const std::vector<int64_t>* tiles);

}  // namespace spmd::runtime
