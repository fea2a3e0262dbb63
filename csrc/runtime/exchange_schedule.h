// Multi-process SPMD: when the collectives whose groups span processes run. Each exchange
// across processes costs a round trip, so such collectives wait to exchange together (one
// call for many: XLA's all-reduce combiner, at run time), and so do the instructions that
// read their results, run after them in program order. The batch runs before an instruction
// that cannot wait: one that writes into an input, reads a result still awaited and cannot
// join the batch, or frees a slot the batch reads; and at the end of the program. A step
// thus exchanges once per level of dependent collectives (a data-parallel step's gradients:
// once). Torch-free: it sees slots, not tensors.
#pragma once
#include <cstddef>
#include <vector>

namespace spmd::runtime {

class ExchangeSchedule {
 public:
  // What the schedule needs of an instruction.
  struct Step {
    const std::vector<int>& inputs;      // slots it reads
    const std::vector<int>& outputs;     // slots it fills
    const std::vector<int>& free_after;  // slots whose last reader it is
    bool writes_an_input = false;
    bool exchange = false;  // a collective across processes: one input, one output
  };
  // Deferred instructions, in program order: the collectives (exchanged together), then the
  // instructions that read their results.
  struct Batch {
    std::vector<size_t> exchanges, readers;
    bool empty() const { return exchanges.empty() && readers.empty(); }
  };

  explicit ExchangeSchedule(size_t num_slots);
  // Instruction `index` comes next in program order. Returns the batch that must run before
  // it (empty: none); `*deferred` is set when the instruction joins the next batch instead of
  // running now.
  Batch Next(size_t index, const Step& step, bool* deferred);
  // What is still deferred at the end of the program.
  Batch Finish();

 private:
  Batch Take();
  Batch batch_;
  std::vector<bool> awaited_;  // slots the batch will fill
  std::vector<bool> held_;     // slots the batch reads
};

}  // namespace spmd::runtime
