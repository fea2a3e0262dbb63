// The last step (run or planned) and its memory figures: what a report of the step reads.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "ir/graph.h"
#include "partition/program.h"

namespace spmd::aten {

// Bytes of live tensors a step does not read, which stay on the devices while it runs.
int64_t BytesBesideStep(const ir::Graph& graph);

// A step that starts running (or being planned) `program`.
void NoteStepStarted(std::shared_ptr<const partition::Program> program);
// A step that completed `program`, freeing the parameters `donated` after their last use, with
// `beside` bytes of live tensors it did not read (BytesBesideStep, taken before it ran).
void RecordStep(std::shared_ptr<const partition::Program> program, std::vector<bool> donated,
                int64_t beside);

// The program of the most recent step (executed or planned) and the parameters that step
// donated; null before the first step.
std::shared_ptr<const partition::Program> LastProgram();
std::vector<bool> LastDonated();

// Statistics of the most recently executed program (collectives, memory, flops, fallbacks).
partition::ProgramStats LastStepStats();

}  // namespace spmd::aten
