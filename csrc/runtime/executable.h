// A compiled SPMD program ready to run: instructions over value slots, each ATen instruction
// with its argument stack prebuilt (only tensors and run-time scalars are filled in per run),
// and the point after which each slot is dead so its buffers are freed early.
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
#include "runtime/fold.h"
#include "runtime/internal_kernels.h"
#include "runtime/row_merge.h"
#include "runtime/stacked.h"
#include "runtime/vmap_level.h"
#include "runtime/view_aliasing.h"

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
  struct Instruction {
    const ir::Node* node;
    int node_index = 0;  // position of `node` in program().nodes
    std::vector<int> inputs;   // slot per node input
    std::vector<int> outputs;  // slot per node output
    std::vector<int> free_after;  // slots whose last use is this instruction
    // ATen ops: the argument stack with constants filled in.
    std::vector<c10::IValue> stack;
    std::vector<std::pair<int, int>> tensor_args;  // (stack position, node input index)
    struct ListArg {
      int position;
      std::vector<int64_t> inputs;  // node input index, -1 for None
      bool optional;
    };
    std::vector<ListArg> list_args;
    struct ScalarArg {
      int position;
      int scalar_index;  // index into the run's scalars
      bool wrapped;      // pass as a wrapped-number tensor
      bool generator;    // a random op's seed: pass a CPU generator seeded with it
      int list_size;     // a Scalar[]: this many scalars from scalar_index on; -1: one Scalar
    };
    std::vector<ScalarArg> scalar_args;
    std::vector<const std::string*> labels;  // per output, for the device memory report
    std::vector<bool> mutable_input;  // per node input: the kernel would write it (cloned first)
    int default_generator_seed = -1;  // run-time scalar index of a random op's seed, or -1
    bool random = false;              // draws random values (a seed above or a Generator arg)
    bool contiguous_inputs = false;   // a stride-sensitive op (see view_aliasing.h)
    ViewAlias alias = ViewAlias::kNone;  // may return a view of its input instead (see Lower)
    bool share_input = false;  // a view dying no later than its input: shares its bytes
    // ATen ops: whether functorch has a batching rule (or a decomposition) for it; without one
    // it runs per row (functorch's own fallback would too, with more overhead).
    bool batch_rule = true;
    // A functionalized view (`x_copy`): the view op `x`, whose batching rule exists where the
    // copy's usually does not; the batched call clones its result.
    const c10::OperatorHandle* view_kernel = nullptr;
    // Its traits say it is elementwise (partition/op_traits.h): it runs directly on the stacked
    // rows when every input stacked over devices has `element_rank[input]` local dims (the
    // rank of the result it broadcasts into; -1: it must be the same on every device).
    bool elementwise = false;
    std::vector<int> element_rank;
    // The factors device rows can merge into (row_merge.h); empty when the op writes an input
    // or is a view.
    MergeFactors merge;
    // A folded contraction (fold.h): its summed results are computed summed.
    std::shared_ptr<const FoldPlan> fold;
    // An additive op (add, sub) between a folded contraction and its reduction: the groups,
    // its one result summed. With a summed operand it runs once per group on the group sums
    // (RunOnGroupSums).
    std::shared_ptr<const FoldPlan> sums_over;
    const InternalKernel* internal_kernel = nullptr;  // spmd:: and xm:: ops
    const StackedKernel* stacked_kernel = nullptr;    // spmd:: ops: preferred
  };
  // A value while the program runs: what each device holds (and accounts), and the same
  // shards stacked (computed from the buffers on first use where a kernel made them per device).
  struct SlotValue {
    PerDevice buffers;
    Stacked stack;
  };
  // The inputs of one ATen op aligned to one row map: see Align.
  struct Aligned {
    RowMapPtr map;
    std::vector<int64_t> first_device;  // per row, a device holding it (when regrouped)
    std::vector<at::Tensor> rows;       // per input: [rows, ...] if batched, else its one shard
    std::vector<bool> batched;
  };

  // Lowering the program into instructions, in steps.
  void Lower();
  Instruction LowerNode(const ir::NodePtr& n, const std::function<int(const ir::Value&)>& slot_of);
  std::vector<int> PlanLiveness();
  void PlanViews(const std::vector<int>& last_use);
  void PlanFolds();
  static bool WritesAnInput(const Instruction& ins);
  // Whether output `output` of instruction `index` reaches an all-reduce or reduce-scatter
  // (sum) over exactly `axes` through views and additive ops, each read once. `additive`
  // (optional) receives the additive ops on the way.
  bool ReachesReduction(size_t index, int output, const std::vector<int>& axes,
                        const std::vector<std::vector<int>>& readers,
                        const std::vector<bool>& is_output,
                        std::vector<size_t>* additive = nullptr) const;
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
  // Whether `ins` is an additive op whose pending sum is over exactly `axes` (sorted).
  bool PassesGroupSums(const Instruction& ins, const std::vector<int>& axes) const;
  // An additive op (Instruction::sums_over) reading a summed value: per group, the op on the
  // group's sums of its operands (a summed operand as it is, any other summed over the
  // members), itself summed: sum_i op(a_i, b_i) = op(sum_i a_i, sum_i b_i).
  std::vector<Stacked> RunOnGroupSums(const Instruction& ins,
                                      const std::vector<const Stacked*>& inputs,
                                      const std::vector<ir::ScalarValue>& scalars) const;
  static const Stacked& StackIn(SlotValue& value);
  Aligned Align(const std::vector<const Stacked*>& inputs, const std::vector<int64_t>* tiles) const;
  // One kernel call on `args` (one tensor per node input): the results, one per node output
  // (undefined where the program expects none). `tile` reseeds a random op's draws.
  std::vector<at::Tensor> CallKernel(const Instruction& ins, std::vector<at::Tensor> args,
                                     const std::vector<ir::ScalarValue>& scalars, int64_t tile,
                                     bool as_view = false) const;
  bool CanRunElementwise(const Instruction& ins, const Aligned& a) const;
  // Runs an op whose inputs vary over devices in one call, stacked: elementwise, with rows
  // merged into dims, or under vmap. nullopt: it must run per row (no batching rule).
  std::optional<std::vector<Stacked>> RunBatched(const Instruction& ins,
                                                 const std::vector<const Stacked*>& inputs,
                                                 const std::vector<ir::ScalarValue>& scalars) const;
  std::vector<Stacked> RunMerged(const Instruction& ins, const MergePlan& plan,
                                 const std::vector<const Stacked*>& inputs,
                                 const std::vector<ir::ScalarValue>& scalars) const;
  // `rows` of the batched inputs as they are (plain tensors, or BatchedTensors of `level`),
  // unbatched written inputs expanded to one copy per row.
  std::vector<at::Tensor> BatchedArgs(const Instruction& ins, const Aligned& a,
                                      const VmapLevel* level) const;
  std::vector<Stacked> RunElementwise(const Instruction& ins, const Aligned& a,
                                      const std::vector<ir::ScalarValue>& scalars) const;
  std::vector<Stacked> RunVmapped(const Instruction& ins, const Aligned& a,
                                  const std::vector<ir::ScalarValue>& scalars) const;
  std::vector<Stacked> RunPerRow(const Instruction& ins, const Aligned& a,
                                 const std::vector<ir::ScalarValue>& scalars,
                                 const std::vector<int64_t>* tiles) const;
  void RunAtenOp(size_t index, std::vector<SlotValue>& slots,
                 const std::vector<ir::ScalarValue>& scalars) const;
  void RunInternalOp(const Instruction& ins, std::vector<SlotValue>& slots) const;
  // A view op without a copy (view_aliasing.h): shares, takes over or borrows its input's
  // bytes. False when it must copy (a reshape of a strided value).
  bool TryAliasInput(const Instruction& ins, std::vector<SlotValue>& slots) const;
  // Whether `input`'s allocations can move to a view of it (no one else holds its buffers).
  static bool CanTakeOver(const SlotValue& input);
  // Stores `results` (one per node output) as the instruction's output slots, each device
  // charging its shard, after checking them against the program's types.
  void StoreResults(const Instruction& ins, std::vector<Stacked> results,
                    std::vector<SlotValue>& slots) const;

  partition::Program program_;
  std::vector<Instruction> instructions_;
  // Per instruction: vmap could not run it (learned on a run; it then runs per row).
  std::unique_ptr<std::atomic<bool>[]> unbatchable_;
  std::vector<int> param_slots_;
  std::vector<int> output_slots_;
  int num_slots_ = 0;
};

}  // namespace spmd::runtime
