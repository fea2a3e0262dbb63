// A compiled SPMD program ready to run: it runs the execution plan (execution_plan.h) the
// program was lowered to, instruction by instruction, each by the path the plan chose for it
// (a view of its input, group sums, a folded contraction, merged rows, elementwise on the
// stacked rows, under vmap, or per row).
#pragma once
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>

#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "partition/program.h"
#include "runtime/device_data.h"
#include "runtime/exchange_schedule.h"
#include "runtime/execution_plan.h"
#include "runtime/process_span.h"
#include "runtime/stacked.h"

namespace spmd::runtime {

// Wall time of each instruction of the most recent successful run, per device: what the
// emulator measured (devices sharing a kernel call share its time). For trace views.
struct RunProfile {
  const partition::Program* program = nullptr;
  std::vector<int> node_index;                // per instruction: its node in program->nodes
  std::vector<std::vector<float>> seconds;    // per instruction, per device
};
RunProfile LastRunProfile();

class Executable {
 public:
  explicit Executable(partition::Program program);
  ~Executable();

  // Runs the program. `params` are in the program's parameter order, already laid out as
  // param_shardings say; `scalars` are the graph's run-time scalars. Returns the outputs as
  // device data. `donated` inputs (empty = none) give their device memory back after their
  // last use in the program, as intermediate values do (their host data stays with the
  // DeviceData). On failure nothing is left allocated, donated inputs take their memory back,
  // and every input is intact.
  //
  // Device-batched: every value is held as a stack of its devices' shards (stacked.h) and each
  // local op runs once over all rows under a vmap level (vmap_level.h), each collective as a
  // stacked kernel; a value replicated on every device is computed once. Ops that vmap cannot
  // run (and random ops, whose tiles draw their own values) run once per distinct row.
  std::vector<DeviceDataPtr> Run(const std::vector<DeviceDataPtr>& params,
                                 const std::vector<ir::ScalarValue>& scalars,
                                 const std::vector<bool>& donated = {}) const;

  const partition::Program& program() const { return program_; }

 private:
  // A value while the program runs: what each device holds (and accounts), and the same
  // shards stacked (computed from the buffers on first use where a kernel made them per device).
  struct SlotValue {
    PerDevice buffers;
    Stacked stack;
  };
  // nullopt: this run's inputs do not fold (an operand the factor's tiles do not cover differs
  // between the members of a group); the op then runs as any other.
  std::optional<std::vector<Stacked>> RunFolded(const Instruction& ins,
                                                const std::vector<const Stacked*>& inputs,
                                                const std::vector<ir::ScalarValue>& scalars) const;
  // The op once per group of `map` on `rows` ([U, ...] per operand, U = map->rows): one call
  // when there is one group, else stacked (RunBatched, or per row).
  std::vector<Stacked> RunPerGroup(const Instruction& ins, std::vector<at::Tensor> rows,
                                   const RowMapPtr& map,
                                   const std::vector<ir::ScalarValue>& scalars) const;
  // An additive op (Instruction::sums_over) reading a summed value: per group, the op on the
  // group's sums of its operands (a summed operand as it is, any other summed over the
  // members), itself summed: sum_i op(a_i, b_i) = op(sum_i a_i, sum_i b_i).
  std::vector<Stacked> RunOnGroupSums(const Instruction& ins,
                                      const std::vector<const Stacked*>& inputs,
                                      const std::vector<ir::ScalarValue>& scalars) const;
  static const Stacked& StackIn(SlotValue& value);
  void RunAtenOp(size_t index, std::vector<SlotValue>& slots,
                 const std::vector<ir::ScalarValue>& scalars) const;
  void RunInternalOp(const Instruction& ins, std::vector<SlotValue>& slots) const;
  // One run's state: the slots, which of them hold donated inputs, the donated buffers whose
  // device memory was given back (taken back if the run fails), the profile, the scalars.
  struct RunState {
    std::vector<SlotValue> slots;
    std::vector<bool> donated_slot;
    std::vector<BufferPtr> given_back;
    RunProfile profile;
    const std::vector<ir::ScalarValue>& scalars;
  };
  // Runs instruction `index` and frees what it read last.
  void RunInstruction(size_t index, RunState& run) const;
  // Runs a batch of deferred collectives across processes (exchange_schedule.h), then the
  // instructions that waited for them.
  void RunBatch(const ExchangeSchedule::Batch& batch, RunState& run) const;
  // Multi-process SPMD: runs the collectives in `deferred` (instruction indices), whose groups
  // span processes, with one exchange for all of them.
  void RunDeferredExchanges(const std::vector<size_t>& deferred,
                            std::vector<SlotValue>& slots) const;
  // The program's outputs as device data.
  std::vector<DeviceDataPtr> OutputsOf(std::vector<SlotValue>& slots) const;
  // A view op without a copy (view_aliasing.h): shares, takes over or borrows its input's
  // bytes. False when it must copy (a reshape of a strided value).
  bool TryAliasInput(const Instruction& ins, std::vector<SlotValue>& slots,
                     const std::vector<ir::ScalarValue>& scalars) const;
  at::Tensor ViewOfRows(const Instruction& ins, const Stacked& s,
                        const std::vector<ir::ScalarValue>& scalars) const;
  // Frees the slots whose last reader `ins` is; a donated input's buffers give their device
  // memory back and are listed in `given_back`.
  static void FreeDeadSlots(const Instruction& ins, const std::vector<bool>& donated_slot,
                            std::vector<SlotValue>& slots, std::vector<BufferPtr>* given_back);
  // Whether `input`'s allocations can move to a view of it (no one else holds its buffers).
  static bool CanTakeOver(const SlotValue& input);
  // Stores `results` (one per node output) as the instruction's output slots, each device
  // charging its shard, after checking them against the program's types.
  void StoreResults(const Instruction& ins, std::vector<Stacked> results,
                    std::vector<SlotValue>& slots) const;

  partition::Program program_;
  ExecutionPlan plan_;  // what to run, decided once (execution_plan.h)
  // Per instruction: a collective across processes, which waits to exchange together with the
  // next ones (XLA's all-reduce combiner, at run time: one exchange of many gradients instead
  // of one each; see Run). Set when a process span is installed.
  std::vector<bool> deferred_exchange_;
  std::vector<bool> chained_exchange_;  // ... whose sums run as a chain (span_kernels.h)
  std::shared_ptr<ProcessSpan> span_;
  // Per instruction: vmap could not run it (learned on a run; it then runs per row).
  std::unique_ptr<std::atomic<bool>[]> unbatchable_;
};

}  // namespace spmd::runtime
