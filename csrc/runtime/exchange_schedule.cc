#include "runtime/exchange_schedule.h"

#include <algorithm>

#include "core/error.h"

namespace spmd::runtime {

ExchangeSchedule::ExchangeSchedule(size_t num_slots)
    : awaited_(num_slots, false), held_(num_slots, false) {}

ExchangeSchedule::Batch ExchangeSchedule::Next(size_t index, const Step& step, bool* deferred) {
  *deferred = false;
  Batch before;
  if (!batch_.empty()) {
    const bool reads_awaited = std::any_of(step.inputs.begin(), step.inputs.end(),
                                           [&](int s) { return awaited_.at(s); });
    if (reads_awaited && !step.writes_an_input && !step.exchange) {
      batch_.readers.push_back(index);
      for (int o : step.outputs) awaited_.at(o) = true;
      for (int in : step.inputs) held_.at(in) = true;
      *deferred = true;
      return before;
    }
    if (reads_awaited || step.writes_an_input ||
        std::any_of(step.free_after.begin(), step.free_after.end(),
                    [&](int s) { return held_.at(s); }))
      before = Take();
  }
  if (step.exchange) {
    SPMD_CHECK(step.inputs.size() == 1 && step.outputs.size() == 1,
               "internal error: an exchange across processes reads and fills one slot");
    batch_.exchanges.push_back(index);
    awaited_.at(step.outputs[0]) = true;
    held_.at(step.inputs[0]) = true;
    *deferred = true;
  }
  return before;
}

ExchangeSchedule::Batch ExchangeSchedule::Finish() { return Take(); }

ExchangeSchedule::Batch ExchangeSchedule::Take() {
  Batch out = std::move(batch_);
  batch_ = Batch{};
  std::fill(awaited_.begin(), awaited_.end(), false);
  std::fill(held_.begin(), held_.end(), false);
  return out;
}

}  // namespace spmd::runtime
