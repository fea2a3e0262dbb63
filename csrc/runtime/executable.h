// A compiled SPMD program ready to run: instructions over value slots, each ATen instruction
// with its argument stack prebuilt (only tensors and run-time scalars are filled in per run),
// and the point after which each slot is dead so its buffers are freed early.
#pragma once
#include <ATen/core/ivalue.h>

#include <memory>
#include <vector>

#include "partition/program.h"
#include "runtime/device_data.h"
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

  // Runs the program. `params` are in the program's parameter order, already laid out as
  // param_shardings say; `scalars` are the graph's run-time scalars. Returns the outputs as
  // device data. `donated` inputs (empty = none) give their device memory back after their
  // last use in the program, as intermediate values do (their host data stays with the
  // DeviceData). On failure nothing is left allocated, donated inputs take their memory back,
  // and every input is intact.
  std::vector<DeviceDataPtr> Run(const std::vector<DeviceDataPtr>& params,
                                 const std::vector<ir::ScalarValue>& scalars,
                                 const std::vector<bool>& donated = {}) const;

  const partition::Program& program() const { return program_; }
  int64_t num_instructions() const { return static_cast<int64_t>(instructions_.size()); }

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
    };
    std::vector<ScalarArg> scalar_args;
    std::vector<const std::string*> labels;  // per output, for the device memory report
    std::vector<int> mutable_inputs;  // node input indices the kernel would write: cloned first
    int default_generator_seed = -1;  // run-time scalar index of a random op's seed, or -1
    bool contiguous_inputs = false;   // a stride-sensitive op (see view_aliasing.h)
    ViewAlias alias = ViewAlias::kNone;  // may return a view of its dying input instead
  };
  using SlotValue = std::vector<BufferPtr>;  // one buffer per device

  void Lower();
  // `seconds[d]`: the wall time of the kernel call that computed device d's result.
  void RunAtenOp(const Instruction& ins, std::vector<SlotValue>& slots,
                 const std::vector<ir::ScalarValue>& scalars, std::vector<float>& seconds) const;
  void RunInternalOp(const Instruction& ins, std::vector<SlotValue>& slots) const;
  bool TryAliasInput(const Instruction& ins, std::vector<SlotValue>& slots) const;

  partition::Program program_;
  std::vector<Instruction> instructions_;
  std::vector<int> param_slots_;
  std::vector<int> output_slots_;
  int num_slots_ = 0;
};

}  // namespace spmd::runtime
