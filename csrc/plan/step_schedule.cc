#include "plan/step_schedule.h"

#include <algorithm>
#include <functional>
#include <queue>
#include <set>
#include <utility>

#include "core/error.h"

namespace spmd::plan {

namespace {

// One schedule's state, built in phases: the compute stream's order, each collective's
// dependences on it, then the walk over the stream issuing collectives as their inputs are
// made and waiting for them at their first readers.
class Scheduler {
 public:
  Scheduler(const ProgramStats& stats, const std::vector<double>& op_seconds,
            const std::vector<double>& collective_seconds, const ScheduleOptions& options)
      : stats_(stats), ops_(stats.op_costs), op_seconds_(op_seconds),
        collective_seconds_(collective_seconds), options_(options), num_ops_(ops_.size()),
        num_collectives_(stats.collectives.size()) {}

  StepSchedule Run() {
    OrderTheComputeStream();
    LinkCollectivesToTheStream();
    s_.op_start.assign(num_ops_, 0);
    s_.collective_start.assign(num_collectives_, 0);
    s_.collective_exposed.assign(num_collectives_, 0);
    end_of_.assign(num_ops_, 0);
    collective_end_.assign(num_collectives_, 0);
    issued_.assign(num_collectives_, false);
    ready_at_.assign(num_collectives_, 0);
    by_needs_.resize(num_collectives_);
    for (size_t j = 0; j < num_collectives_; ++j) by_needs_[j] = j;
    std::stable_sort(by_needs_.begin(), by_needs_.end(),
                     [&](size_t a, size_t b) { return needs_[a] < needs_[b]; });
    for (size_t t = 0; t < num_ops_; ++t) {
      HandOverCollectivesReadyAt(t);
      RunOp(t);
    }
    HandOverCollectivesReadyAt(num_ops_);
    // The end of the step: every collective is done.
    while (!later_.empty() || !ready_now_.empty()) IssueNext();
    const double comm_done = *std::max_element(direction_free_, direction_free_ + 4);
    if (last_ < num_collectives_ && comm_done > compute_free_)
      s_.collective_exposed[last_] += comm_done - compute_free_;
    s_.seconds = std::max(compute_free_, comm_done);
    return std::move(s_);
  }

 private:
  // The compute stream's order: communication-free ops first, then the rest; `slot_[k]` is op
  // k's place in it. `waiting_` holds the positions of the ops that may wait for
  // communication, in program order (they run in that order after the first `early_` ops).
  void OrderTheComputeStream() {
    slot_.resize(num_ops_);
    for (size_t k = 0; k < num_ops_; ++k) {
      position_.push_back(ops_[k].position);
      if (ops_[k].independent_of_collectives) order_.push_back(k);
    }
    early_ = order_.size();
    for (size_t k = 0; k < num_ops_; ++k)
      if (!ops_[k].independent_of_collectives) {
        order_.push_back(k);
        waiting_.push_back(ops_[k].position);
      }
    for (size_t t = 0; t < num_ops_; ++t) slot_[order_[t]] = t;
  }

  // How many ops of the stream must be done before the compute stream passes program position
  // p: the early ones and the waiting ones before p.
  size_t Reached(int64_t p) const {
    return early_ + static_cast<size_t>(std::lower_bound(waiting_.begin(), waiting_.end(), p) -
                                        waiting_.begin());
  }

  // Per collective: how many ops of the stream must be done before it may start (its input's
  // producer: the last op at or before the input's position; the backward's end for a
  // gradient reduction the runtime holds back; the reader of the previous copy back from
  // host memory; the reader of the all-gather `all_gather_prefetch` before it), and the place
  // of the op that waits for it (the first waiting op at or after its first reader; num_ops:
  // the end).
  void LinkCollectivesToTheStream() {
    needs_.resize(num_collectives_);
    waiters_.resize(num_ops_);
    std::vector<size_t> gathers;  // all-gathers in issue order
    // How many ops of the stream end the backward: the early ones and the waiting ones up to
    // its last op.
    size_t backward_done = 0;
    for (size_t k = 0; k < num_ops_; ++k)
      if (ops_[k].in_backward) backward_done = std::max(backward_done, slot_[k] + 1);
    const int64_t prefetch = options_.all_gather_prefetch;
    size_t last_reload = num_collectives_;  // the latest copy back from host memory so far
    for (size_t j = 0; j < num_collectives_; ++j) {
      const CollectiveStat& c = stats_.collectives[j];
      const size_t producers = static_cast<size_t>(
          std::upper_bound(position_.begin(), position_.end(), c.input_position) -
          position_.begin());
      needs_[j] = producers > 0 ? slot_[producers - 1] + 1 : 0;
      const size_t waited_at = Reached(c.first_use_position);
      if (waited_at < num_ops_) waiters_[waited_at].push_back(j);
      if (options_.gradients_after_backward && c.after_backward)
        needs_[j] = std::max(needs_[j], backward_done);
      if (c.kind == "host-to-device") {  // one copy ahead of the compute that reads it
        if (last_reload < num_collectives_)
          needs_[j] = std::max(needs_[j],
                               Reached(stats_.collectives[last_reload].first_use_position));
        last_reload = j;
      }
      if (c.kind != "all-gather") continue;
      if (prefetch > 0 && gathers.size() >= static_cast<size_t>(prefetch)) {
        const CollectiveStat& earlier = stats_.collectives[gathers[gathers.size() - prefetch]];
        needs_[j] = std::max(needs_[j], Reached(std::min(earlier.first_use_position, c.position)));
      }
      gathers.push_back(j);
    }
  }

  // The collectives whose inputs the first t ops of the stream make join the queue.
  void HandOverCollectivesReadyAt(size_t t) {
    for (; known_ < num_collectives_ && needs_[by_needs_[known_]] <= t; ++known_) {
      const size_t j = by_needs_[known_];
      ready_at_[j] = needs_[j] > 0 ? end_of_[needs_[j] - 1] : 0;
      later_.push({ready_at_[j], j});
    }
  }

  int ChannelOf(size_t j) const {
    const int c = j < options_.channels.size() ? options_.channels[j]
                                               : stats_.collectives[j].channel;
    return c >= 3 || options_.directions_apart ? c : 0;
  }

  // Starts the collective that can start first (the earliest in the program among those
  // ready when the stream is free): what a scheduler issuing ready collectives does.
  void IssueNext() {
    while (!later_.empty() && later_.top().first <= comm_free_) {
      ready_now_.insert(later_.top().second);
      later_.pop();
    }
    size_t j;
    if (!ready_now_.empty()) {
      j = *ready_now_.begin();
      ready_now_.erase(ready_now_.begin());
    } else {
      j = later_.top().second;
      comm_free_ = later_.top().first;
      later_.pop();
    }
    const int channel = ChannelOf(j);
    const double free = channel == 0 ? std::max(direction_free_[0], direction_free_[1])
                                     : direction_free_[channel - 1];
    // (A host-link copy waits for its own stream only, not for the links.)
    s_.collective_start[j] = std::max(channel >= 3 ? ready_at_[j] : comm_free_, free);
    collective_end_[j] = s_.collective_start[j] + collective_seconds_[j];
    for (int d = 0; d < 4; ++d)
      if ((channel == 0 && d < 2) || channel == d + 1) direction_free_[d] = collective_end_[j];
    // (Which collective goes next is chosen when a link is free; the host link's streams,
    // idle most of the step, would make every collective look issuable at once.)
    comm_free_ = std::min(direction_free_[0], direction_free_[1]);
    if (last_ == num_collectives_ || collective_end_[j] >= collective_end_[last_]) last_ = j;
    issued_[j] = true;
  }

  // The op at place t waits for the collectives it reads first: they are issued (with any
  // that can go before them) and waited for; then for the host to have issued its kernel.
  void RunOp(size_t t) {
    double wait_until = compute_free_;
    size_t charged = num_collectives_;
    for (size_t j : waiters_[t]) {
      while (!issued_[j]) {
        SPMD_CHECK(!later_.empty() || !ready_now_.empty(),
                   "internal error: an op reads collective ", j,
                   " before that collective's input can be produced");
        IssueNext();
      }
      if (collective_end_[j] > wait_until) {
        wait_until = collective_end_[j];
        charged = j;
      }
    }
    if (charged < num_collectives_) s_.collective_exposed[charged] += wait_until - compute_free_;
    const size_t k = order_[t];
    if (k < options_.launches.size() && options_.launches[k]) {
      host_issued_ += options_.kernel_overhead;
      if (host_issued_ > wait_until) {
        s_.host_bound_seconds += host_issued_ - wait_until;
        wait_until = host_issued_;
      }
    }
    s_.op_start[k] = wait_until;
    compute_free_ = end_of_[t] = wait_until + op_seconds_[k];
  }

  const ProgramStats& stats_;
  const std::vector<OpCost>& ops_;
  const std::vector<double>& op_seconds_;
  const std::vector<double>& collective_seconds_;
  const ScheduleOptions& options_;
  const size_t num_ops_, num_collectives_;
  // The compute stream's order (OrderTheComputeStream).
  std::vector<size_t> order_, slot_;
  std::vector<int64_t> position_, waiting_;
  size_t early_ = 0;
  // Per collective, how many ops of the stream it needs done; per stream place, the
  // collectives the op there waits for (LinkCollectivesToTheStream).
  std::vector<size_t> needs_;
  std::vector<std::vector<size_t>> waiters_;
  // The walk.
  StepSchedule s_;
  std::vector<double> end_of_, collective_end_;  // by stream place; by collective
  std::vector<bool> issued_;
  std::vector<double> ready_at_;  // when its input is there
  double compute_free_ = 0, comm_free_ = 0;  // comm_free_: when the first direction is free
  // When each stream is free: the two directions of the links (one stream where they are not
  // apart), and the two of the host link.
  double direction_free_[4] = {0, 0, 0, 0};
  double host_issued_ = 0;  // when the host has issued the kernels so far
  size_t last_ = num_collectives_;  // the collective that ended last
  // Collectives whose inputs the ops done so far produce, not yet issued: those ready by the
  // time the communication stream is free, by program order, and the rest by ready time.
  using Entry = std::pair<double, size_t>;  // (ready time, collective)
  std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> later_;
  std::set<size_t> ready_now_;
  size_t known_ = 0;  // collectives (by needs, ascending) handed to the queues so far
  std::vector<size_t> by_needs_;
};

}  // namespace

StepSchedule ScheduleStep(const ProgramStats& stats, const std::vector<double>& op_seconds,
                          const std::vector<double>& collective_seconds,
                          const ScheduleOptions& options) {
  return Scheduler(stats, op_seconds, collective_seconds, options).Run();
}

}  // namespace spmd::plan
