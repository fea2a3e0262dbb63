// The execution plan: a compiled program lowered once into instructions over value slots, with
// every decision the executor would otherwise take per run made here: each ATen op's kernel
// resolved and its argument stack prebuilt (only tensors and run-time scalars are filled in
// per run), the point after which each slot is dead, which views alias their input
// (view_aliasing.h), which ops may run with devices' rows merged (row_merge.h), which
// contractions fold into their reduction and which additive ops on the way run on group sums
// (fold.h). It reads the program's OpTraits, never a sharding rule.
#pragma once
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "partition/program.h"
#include "runtime/fold.h"
#include "runtime/internal_kernels.h"
#include "runtime/row_merge.h"
#include "runtime/view_aliasing.h"

namespace spmd::runtime {

struct Instruction {
  const ir::Node* node;
  int node_index = 0;  // position of `node` in the program's nodes
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
  bool contiguous_inputs = false;   // it reads strides (OpTraits::reads_strides) or raw lists
  // May return a view of its input instead of a copy, of this kind (view_aliasing.h).
  ViewKind alias = ViewKind::kNone;
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
  // Its result lives in its devices' hosts' memory (spmd::place_to_host): charged there, not
  // to the devices.
  bool on_host = false;
};

struct ExecutionPlan {
  std::vector<Instruction> instructions;
  std::vector<int> param_slots;   // per program parameter
  std::vector<int> output_slots;  // per program output
  int num_slots = 0;
};

// Lowers `program` (which must outlive the plan: instructions point at its nodes).
ExecutionPlan PlanExecution(const partition::Program& program);

// SPMD_EXACT_ROWS=1: every local op runs once per distinct device row, each row contiguous (no
// batching over rows, no folded contractions), so a device's results do not depend on how many
// devices' shards are stacked with it: 1 process x N devices and P processes x N/P give the
// same bits (kernels vectorize, block and reduce by a tensor's size and strides) when they run
// as many intra-op threads. Slower; for checking layouts against each other.
bool RowExactExecution();

// The ATen kernel of `op`, resolved once per op.
const c10::OperatorHandle& KernelFor(const ir::OpInfo* op);
// Whether the instruction's kernel would write one of its inputs.
bool WritesAnInput(const Instruction& ins);
// A scalar argument as the kernel takes it (a wrapped-number tensor when `wrapped`).
c10::IValue ScalarIValue(const c10::Scalar& s, bool wrapped);

}  // namespace spmd::runtime
