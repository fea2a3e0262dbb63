#include "aten/step_memory.h"

#include <optional>
#include <unordered_set>

#include "aten/lazy_tensor.h"
#include "partition/cost.h"
#include "plan/caching_allocator.h"
#include "runtime/device_data.h"

namespace spmd::aten {

namespace {

// Bytes each device holds in the data of live tensors (each data counted once, whether
// planned or real): what stays resident between steps.
// `skip`: data not to count (a step's own parameters).
int64_t ResidentBytesPerDevice(std::unordered_set<const ir::DataHandle*> skip = {}) {
  int64_t bytes = 0;
  for (const SlotPtr& s : LiveSlots()) {
    if (!s->value.valid() || !s->value.node->is_data()) continue;
    const ir::DataHandle* data = s->value.node->data().get();
    if (!skip.insert(data).second) continue;
    bytes += static_cast<const runtime::DeviceData*>(data)->BytesPerDevice();
  }
  return bytes;
}

// The last step (run or planned) and what its memory figures need. The figures themselves
// (a liveness pass over the program) are computed when first asked for, not on every step;
// what depends on the moment (the bytes of live tensors) is taken when the step runs.
struct LastStep {
  std::shared_ptr<const partition::Program> program;  // of the last step started
  std::shared_ptr<const partition::Program> done;     // of the last step that completed
  std::vector<bool> donated;  // parameters `done` freed after their last use
  int64_t beside = 0;         // bytes of live tensors the step does not read
  int64_t resident = 0;       // bytes of live tensors after the step
  std::optional<partition::ProgramStats> stats;
};
LastStep& Last() {
  static auto* last = new LastStep();
  return *last;
}

// The step's statistics, with the parameters it donates freed after their last use (a
// program's own peak_bytes_per_device assumes none is).
partition::ProgramStats StepStats(const LastStep& last) {
  if (!last.done) return {};
  const partition::Program& program = *last.done;
  partition::ProgramStats stats = program.stats;
  int64_t at = 0;
  stats.peak_bytes_per_device = partition::PeakBytesPerDevice(program, &at, &last.donated);
  if (!program.nodes.empty()) stats.peak_op = program.nodes[at]->op()->qualified;
  stats.resident_bytes_per_device = last.resident;
  stats.device_peak_bytes = last.beside + stats.peak_bytes_per_device;
  stats.reserved_bytes_per_device =
      plan::ReservedPeakPerDevice(program, last.beside, &last.donated);
  return stats;
}

}  // namespace

int64_t BytesBesideStep(const ir::Graph& graph) {
  std::unordered_set<const ir::DataHandle*> params;
  for (const ir::NodePtr& p : graph.params) params.insert(p->data().get());
  return ResidentBytesPerDevice(std::move(params));
}

void NoteStepStarted(std::shared_ptr<const partition::Program> program) {
  Last().program = std::move(program);
}

void RecordStep(std::shared_ptr<const partition::Program> program, std::vector<bool> donated,
                int64_t beside) {
  LastStep& last = Last();
  last.done = std::move(program);
  last.donated = std::move(donated);
  last.beside = beside;
  last.resident = ResidentBytesPerDevice();
  last.stats.reset();
}

std::shared_ptr<const partition::Program> LastProgram() {
  std::lock_guard<GraphLock> lock(GraphMutex());
  return Last().program;
}

std::vector<bool> LastDonated() {
  std::lock_guard<GraphLock> lock(GraphMutex());
  return Last().donated;
}

partition::ProgramStats LastStepStats() {
  std::lock_guard<GraphLock> lock(GraphMutex());
  LastStep& last = Last();
  if (!last.stats) last.stats = StepStats(last);
  return *last.stats;
}

}  // namespace spmd::aten
