// When multi-process SPMD's collectives across processes run (runtime/exchange_schedule.h):
// they wait to exchange together, their readers wait with them, and the batch runs before an
// instruction that cannot wait.
#include "runtime/exchange_schedule.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace spmd::runtime {
namespace {

struct Ins {
  std::vector<int> inputs, outputs, free_after;
  bool writes_an_input = false, exchange = false;
};

// Feeds `program` through a schedule; returns, per instruction, when it ran: "run" now, or the
// batch it ran in ("b0: exchange", "b0: reader"), batches numbered in the order they ran.
std::vector<std::string> Schedule(const std::vector<Ins>& program, size_t num_slots) {
  ExchangeSchedule schedule(num_slots);
  std::vector<std::string> when(program.size());
  int batches = 0;
  auto ran = [&](const ExchangeSchedule::Batch& b) {
    if (b.empty()) return;
    const std::string name = "b" + std::to_string(batches++);
    for (size_t i : b.exchanges) when[i] = name + ": exchange";
    for (size_t i : b.readers) when[i] = name + ": reader";
  };
  for (size_t i = 0; i < program.size(); ++i) {
    const Ins& p = program[i];
    bool deferred = false;
    ran(schedule.Next(i, {p.inputs, p.outputs, p.free_after, p.writes_an_input, p.exchange},
                      &deferred));
    if (!deferred) when[i] = "run";
  }
  ran(schedule.Finish());
  return when;
}

TEST(ExchangeScheduleTest, CollectivesAcrossProcessesExchangeOnceAtTheEnd) {
  // A data-parallel step's gradients: three all-reduces, none read before the end.
  std::vector<Ins> program = {
      {{0}, {1}, {}, false, false},  // a gradient
      {{1}, {2}, {}, false, true},   // its all-reduce
      {{0}, {3}, {0}, false, false},
      {{3}, {4}, {}, false, true},
      {{4}, {5}, {}, false, false},  // reads the second result: waits with the batch
  };
  EXPECT_EQ(Schedule(program, 6),
            (std::vector<std::string>{"run", "b0: exchange", "run", "b0: exchange",
                                      "b0: reader"}));
}

TEST(ExchangeScheduleTest, TheBatchRunsBeforeWhatCannotWait) {
  // A reader that writes into its input cannot wait (its input would change under the batch);
  // nor can an instruction that frees a slot the batch reads.
  std::vector<Ins> writes = {
      {{0}, {1}, {}, false, true},
      {{1}, {2}, {}, /*writes_an_input=*/true, false},
  };
  EXPECT_EQ(Schedule(writes, 3), (std::vector<std::string>{"b0: exchange", "run"}));
  std::vector<Ins> frees = {
      {{0}, {1}, {}, false, true},
      {{2}, {3}, {0}, false, false},  // frees slot 0, which the exchange reads
      {{1}, {4}, {}, false, true},
  };
  EXPECT_EQ(Schedule(frees, 5), (std::vector<std::string>{"b0: exchange", "run", "b1: exchange"}));
}

TEST(ExchangeScheduleTest, DependentCollectivesExchangeOncePerLevel) {
  // An exchange of a result still awaited starts the next batch.
  std::vector<Ins> program = {
      {{0}, {1}, {}, false, true},
      {{1}, {2}, {}, false, true},  // reads the first exchange's result
      {{5}, {6}, {}, false, false}, // independent: runs now
  };
  EXPECT_EQ(Schedule(program, 7),
            (std::vector<std::string>{"b0: exchange", "b1: exchange", "run"}));
}

TEST(ExchangeScheduleTest, OneProcessDefersNothing) {
  std::vector<Ins> program = {{{0}, {1}, {0}, true, false}, {{1}, {2}, {}, false, false}};
  EXPECT_EQ(Schedule(program, 0), (std::vector<std::string>{"run", "run"}));
}

}  // namespace
}  // namespace spmd::runtime
