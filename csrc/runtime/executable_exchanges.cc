// Multi-process SPMD: a batch of collectives whose groups span processes, run with one
// exchange for all of them (exchange_schedule.h says when): sums along the chain of processes
// where the collective's sums chain (span_kernels.h), one all-gather of every process's input
// for the others.
#include "runtime/executable.h"

#include <ATen/ATen.h>

#include "runtime/span_kernels.h"

namespace spmd::runtime {

void Executable::RunDeferredExchanges(const std::vector<size_t>& deferred,
                                      std::vector<SlotValue>& slots) const {
  if (deferred.empty()) return;
  std::vector<size_t> chained, gathered;
  for (size_t index : deferred)
    (chained_exchange_[index] ? chained : gathered).push_back(index);
  auto input_of = [&](size_t index) -> const Stacked& {
    return StackIn(slots[plan_.instructions[index].inputs[0]]);
  };
  if (!chained.empty()) {
    // Sums along the chain of processes, then the last one's to everyone (span_kernels.h).
    const int64_t me = span_->process_index(), last = span_->process_count() - 1;
    std::vector<at::Tensor> received(chained.size());
    if (me > 0) {
      std::vector<at::Tensor> likes;  // what process 0 computes: shaped without data
      for (size_t index : chained)
        likes.push_back(EmptyGroupSums(*plan_.instructions[index].node, input_of(index)));
      received = span_->RecvMany(likes, me - 1, "sums across processes");
    }
    std::vector<at::Tensor> sums;
    for (size_t i = 0; i < chained.size(); ++i)
      sums.push_back(ChainPartialSums(*plan_.instructions[chained[i]].node,
                                      input_of(chained[i]), received[i], *span_));
    if (me < last) span_->SendMany(sums, me + 1, "sums across processes");
    sums = span_->BroadcastMany(sums, last, "sums across processes");
    for (size_t i = 0; i < chained.size(); ++i) {
      const Instruction& ins = plan_.instructions[chained[i]];
      StoreResults(ins, RunWithGroupSums(*ins.node, sums[i], *span_), slots);
    }
  }
  if (gathered.empty()) return;
  std::vector<at::Tensor> mine;
  for (size_t index : gathered) mine.push_back(ExchangeInput(input_of(index)));
  std::vector<at::Tensor> all = span_->AllGatherMany(mine, "collectives across processes");
  for (size_t i = 0; i < gathered.size(); ++i) {
    const Instruction& ins = plan_.instructions[gathered[i]];
    StoreResults(ins, RunWithExchanged(*ins.node, all[i], *span_), slots);
  }
}

}  // namespace spmd::runtime
