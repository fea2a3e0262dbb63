#include "plan/step_schedule.h"

#include <algorithm>
#include <functional>
#include <queue>
#include <set>
#include <utility>

#include "core/error.h"

namespace spmd::plan {

StepSchedule ScheduleStep(const ProgramStats& stats, const std::vector<double>& op_seconds,
                          const std::vector<double>& collective_seconds,
                          const ScheduleOptions& options) {
  const int64_t all_gather_prefetch = options.all_gather_prefetch;
  const std::vector<bool>& launches = options.launches;
  const std::vector<int>& channels = options.channels;
  const double kernel_overhead = options.kernel_overhead;
  const bool directions_apart = options.directions_apart;
  const std::vector<OpCost>& ops = stats.op_costs;
  const size_t num_ops = ops.size(), num_collectives = stats.collectives.size();
  // The compute stream's order: communication-free ops first, then the rest; `slot[k]` is op
  // k's place in it. `waiting` holds the positions of the ops that may wait for
  // communication, in program order (they run in that order after the first `early` ops).
  std::vector<size_t> order, slot(num_ops);
  std::vector<int64_t> position, waiting;
  for (size_t k = 0; k < num_ops; ++k) {
    position.push_back(ops[k].position);
    if (ops[k].independent_of_collectives) order.push_back(k);
  }
  const size_t early = order.size();
  for (size_t k = 0; k < num_ops; ++k)
    if (!ops[k].independent_of_collectives) {
      order.push_back(k);
      waiting.push_back(ops[k].position);
    }
  for (size_t t = 0; t < num_ops; ++t) slot[order[t]] = t;
  // How many ops of the stream must be done before the compute stream passes program position
  // p: the early ones and the waiting ones before p.
  auto reached = [&](int64_t p) {
    return early + static_cast<size_t>(std::lower_bound(waiting.begin(), waiting.end(), p) -
                                       waiting.begin());
  };
  // Per collective: how many ops of the stream must be done before it may start (its input's
  // producer: the last op at or before the input's position), and the place of the op that
  // waits for it (the first waiting op at or after its first reader; num_ops: the end).
  std::vector<size_t> needs(num_collectives), waited_at(num_collectives);
  std::vector<size_t> gathers;  // all-gathers in issue order
  // How many ops of the stream end the backward: the early ones and the waiting ones up to
  // its last op.
  size_t backward_done = 0;
  for (size_t k = 0; k < num_ops; ++k)
    if (ops[k].in_backward) backward_done = std::max(backward_done, slot[k] + 1);
  size_t last_reload = num_collectives;  // the latest copy back from host memory so far
  for (size_t j = 0; j < num_collectives; ++j) {
    const CollectiveStat& c = stats.collectives[j];
    const size_t producers = static_cast<size_t>(
        std::upper_bound(position.begin(), position.end(), c.input_position) - position.begin());
    needs[j] = producers > 0 ? slot[producers - 1] + 1 : 0;
    waited_at[j] = reached(c.first_use_position);
    if (options.gradients_after_backward && c.after_backward)
      needs[j] = std::max(needs[j], backward_done);
    if (c.kind == "host-to-device") {  // one copy ahead of the compute that reads it
      if (last_reload < num_collectives)
        needs[j] = std::max(needs[j],
                            reached(stats.collectives[last_reload].first_use_position));
      last_reload = j;
    }
    if (c.kind != "all-gather") continue;
    if (all_gather_prefetch > 0 && gathers.size() >= static_cast<size_t>(all_gather_prefetch)) {
      const CollectiveStat& earlier = stats.collectives[gathers[gathers.size() - all_gather_prefetch]];
      needs[j] = std::max(needs[j], reached(std::min(earlier.first_use_position, c.position)));
    }
    gathers.push_back(j);
  }
  std::vector<std::vector<size_t>> waiters(num_ops);
  for (size_t j = 0; j < num_collectives; ++j)
    if (waited_at[j] < num_ops) waiters[waited_at[j]].push_back(j);

  StepSchedule s;
  s.op_start.assign(num_ops, 0);
  s.collective_start.assign(num_collectives, 0);
  s.collective_exposed.assign(num_collectives, 0);
  std::vector<double> end_of(num_ops, 0), collective_end(num_collectives, 0);  // by stream place
  std::vector<bool> issued(num_collectives, false);
  std::vector<double> ready_at(num_collectives, 0);  // when its input is there
  double compute_free = 0, comm_free = 0;  // comm_free: when the first direction is free
  // When each stream is free: the two directions of the links (one stream where they are not
  // apart), and the two of the host link.
  double direction_free[4] = {0, 0, 0, 0};
  auto channel_of = [&](size_t j) {
    const int c = j < channels.size() ? channels[j] : stats.collectives[j].channel;
    return c >= 3 || directions_apart ? c : 0;
  };
  double host_issued = 0;  // when the host has issued the kernels so far
  size_t last = num_collectives;  // the collective that ended last
  // Collectives whose inputs the ops done so far produce, not yet issued: those ready by the
  // time the communication stream is free, by program order, and the rest by ready time.
  using Entry = std::pair<double, size_t>;  // (ready time, collective)
  std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> later;
  std::set<size_t> ready_now;
  size_t known = 0;  // collectives (by needs, ascending) handed to the queues so far
  std::vector<size_t> by_needs(num_collectives);
  for (size_t j = 0; j < num_collectives; ++j) by_needs[j] = j;
  std::stable_sort(by_needs.begin(), by_needs.end(),
                   [&](size_t a, size_t b) { return needs[a] < needs[b]; });
  // Starts the collective that can start first (the earliest in the program among those
  // ready when the stream is free): what a scheduler issuing ready collectives does.
  auto issue_next = [&] {
    while (!later.empty() && later.top().first <= comm_free) {
      ready_now.insert(later.top().second);
      later.pop();
    }
    size_t j;
    if (!ready_now.empty()) {
      j = *ready_now.begin();
      ready_now.erase(ready_now.begin());
    } else {
      j = later.top().second;
      comm_free = later.top().first;
      later.pop();
    }
    const int channel = channel_of(j);
    const double free = channel == 0 ? std::max(direction_free[0], direction_free[1])
                                     : direction_free[channel - 1];
    // (A host-link copy waits for its own stream only, not for the links.)
    s.collective_start[j] = std::max(channel >= 3 ? ready_at[j] : comm_free, free);
    collective_end[j] = s.collective_start[j] + collective_seconds[j];
    for (int d = 0; d < 4; ++d)
      if ((channel == 0 && d < 2) || channel == d + 1) direction_free[d] = collective_end[j];
    // (Which collective goes next is chosen when a link is free; the host link's streams,
    // idle most of the step, would make every collective look issuable at once.)
    comm_free = std::min(direction_free[0], direction_free[1]);
    if (last == num_collectives || collective_end[j] >= collective_end[last]) last = j;
    issued[j] = true;
  };
  for (size_t t = 0; t <= num_ops; ++t) {
    for (; known < num_collectives && needs[by_needs[known]] <= t; ++known) {
      const size_t j = by_needs[known];
      ready_at[j] = needs[j] > 0 ? end_of[needs[j] - 1] : 0;
      later.push({ready_at[j], j});
    }
    if (t == num_ops) {  // the end of the step: every collective is done
      while (!later.empty() || !ready_now.empty()) issue_next();
      const double comm_done = *std::max_element(direction_free, direction_free + 4);
      if (last < num_collectives && comm_done > compute_free)
        s.collective_exposed[last] += comm_done - compute_free;
      s.seconds = std::max(compute_free, comm_done);
      break;
    }
    // The op at place t waits for the collectives it reads first: they are issued (with any
    // that can go before them) and waited for.
    double wait_until = compute_free;
    size_t charged = num_collectives;
    for (size_t j : waiters[t]) {
      while (!issued[j]) {
        SPMD_CHECK(!later.empty() || !ready_now.empty(), "internal error: an op reads collective ",
                   j, " before that collective's input can be produced");
        issue_next();
      }
      if (collective_end[j] > wait_until) {
        wait_until = collective_end[j];
        charged = j;
      }
    }
    if (charged < num_collectives) s.collective_exposed[charged] += wait_until - compute_free;
    if (order[t] < launches.size() && launches[order[t]]) {
      host_issued += kernel_overhead;
      if (host_issued > wait_until) {
        s.host_bound_seconds += host_issued - wait_until;
        wait_until = host_issued;
      }
    }
    s.op_start[order[t]] = wait_until;
    compute_free = end_of[t] = wait_until + op_seconds[order[t]];
  }
  return s;
}

}  // namespace spmd::plan
