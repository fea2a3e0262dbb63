#include "runtime/plan_mode.h"

#include <atomic>
#include <mutex>

namespace spmd::runtime {

namespace {
std::atomic<bool> g_planning{false};
std::mutex g_mu;
std::string& Name() {
  static auto* name = new std::string();
  return *name;
}
}  // namespace

bool Planning() { return g_planning.load(std::memory_order_relaxed); }

void SetPlanning(bool on, std::string name) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (on) Name() = std::move(name);
  g_planning.store(on);
}

const std::string& PlanName() { return Name(); }

PlanningPaused::PlanningPaused() : was_planning_(g_planning.exchange(false)) {}
PlanningPaused::~PlanningPaused() { g_planning.store(was_planning_); }

PlannedDataError::PlannedDataError(const std::string& what_is_read)
    : std::runtime_error(
          "cannot " + what_is_read + ": the tensor holds no data, it was made inside " +
          (PlanName().empty() ? std::string("a torch_spmd.plan.Plan") : PlanName()) +
          " (plan mode tracks shapes, dtypes and shardings only, and executes nothing). Read "
          "values from a program run outside the plan, or use the plan's report().") {}

}  // namespace spmd::runtime
