// A compiled SPMD program ready to run: instructions over value slots, each ATen instruction
// with its argument stack prebuilt (only tensors and run-time scalars are filled in per run),
// and the point after which each slot is dead so its buffers are freed early.
#pragma once
#include <ATen/core/ivalue.h>

#include <memory>
#include <vector>

#include "partition/program.h"
#include "runtime/device_data.h"

namespace spmd::runtime {

class Executable {
 public:
  explicit Executable(partition::Program program);

  // Runs the program. `params` are in the program's parameter order, already laid out as
  // param_shardings say; `scalars` are the graph's run-time scalars. Returns the outputs as
  // device data. On failure nothing is left allocated and the inputs are untouched.
  std::vector<DeviceDataPtr> Run(const std::vector<DeviceDataPtr>& params,
                                 const std::vector<ir::ScalarValue>& scalars) const;

  const partition::Program& program() const { return program_; }
  int64_t num_instructions() const { return static_cast<int64_t>(instructions_.size()); }

 private:
  struct Instruction {
    const ir::Node* node;
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
    bool layout_sensitive = false;    // self is passed contiguous (see IsLayoutSensitive)
    int default_generator_seed = -1;  // run-time scalar index of a random op's seed, or -1
  };
  using SlotValue = std::vector<BufferPtr>;  // one buffer per device

  void Lower();
  void RunAtenOp(const Instruction& ins, std::vector<SlotValue>& slots,
                 const std::vector<ir::ScalarValue>& scalars) const;
  void RunInternalOp(const Instruction& ins, std::vector<SlotValue>& slots) const;

  partition::Program program_;
  std::vector<Instruction> instructions_;
  std::vector<int> param_slots_;
  std::vector<int> output_slots_;
  int num_slots_ = 0;
};

}  // namespace spmd::runtime
