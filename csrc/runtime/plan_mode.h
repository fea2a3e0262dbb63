// Plan mode (torch_spmd.plan.Plan): while it is on, device data holds shape, dtype and layout
// but no buffers, and steps are partitioned and analysed instead of executed. Nothing in the
// compiler knows about it; the runtime and the sync path do.
#pragma once
#include <stdexcept>
#include <string>

namespace spmd::runtime {

bool Planning();
void SetPlanning(bool on, std::string name = "");
// The name the active (or last) plan was given, for error messages.
const std::string& PlanName();

// Turns plan mode off while it lives (restoring it after): what it runs is a real step on
// real data (plan mode computes the values it keeps, DeviceData::KeepsKnownValue, this way).
class PlanningPaused {
 public:
  PlanningPaused();
  ~PlanningPaused();
  PlanningPaused(const PlanningPaused&) = delete;
  PlanningPaused& operator=(const PlanningPaused&) = delete;

 private:
  bool was_planning_;
};

// Reading the values of data that has none (made inside a plan), or running a real step on
// it. A RuntimeError in Python.
class PlannedDataError : public std::runtime_error {
 public:
  explicit PlannedDataError(const std::string& what_is_read);
};

}  // namespace spmd::runtime
