#include "runtime/batched_run.h"

#include <ATen/ATen.h>

#include "core/error.h"
#include "runtime/device_set.h"
#include "runtime/kernel_call.h"
#include "runtime/row_merge.h"
#include "runtime/vmap_level.h"

namespace spmd::runtime {

namespace {

bool CanRunElementwise(const Instruction& ins, const AlignedInputs& a) {
  if (!ins.elementwise) return false;
  bool zero_dim = false;
  for (size_t i = 0; i < a.rows.size(); ++i) {
    if (!a.batched[i]) continue;
    if (ins.element_rank[i] < 0 || a.rows[i].dim() - 1 != ins.element_rank[i]) return false;
    zero_dim |= ins.element_rank[i] == 0;
  }
  // Stacked, a 0-dim operand has a dim: type promotion would treat it as a tensor, not a
  // scalar, against an unstacked 0-dim one. Fine when all have one dtype.
  if (zero_dim)
    for (const at::Tensor& t : a.rows)
      if (t.scalar_type() != a.rows[0].scalar_type()) return false;
  return true;
}

std::vector<Stacked> RunMerged(const Instruction& ins, const MergePlan& plan,
                               const std::vector<const Stacked*>& inputs,
                               const std::vector<ir::ScalarValue>& scalars) {
  std::vector<at::Tensor> args(inputs.size());
  for (size_t i = 0; i < args.size(); ++i) {
    args[i] = plan.input_dim[i] >= 0 ? MergeRows(inputs[i]->rows, plan.input_dim[i])
                                     : inputs[i]->Row(0);
    if (ins.contiguous_inputs) args[i] = args[i].contiguous();  // it reads strides
  }
  std::vector<at::Tensor> outs = CallKernel(ins, std::move(args), scalars, 0);
  std::vector<Stacked> results(outs.size());
  for (size_t o = 0; o < outs.size(); ++o)
    if (outs[o].defined())
      results[o] = Stacked{SplitRows(outs[o], plan.output_dim[o], plan.group_rows), plan.map};
  return results;
}

std::vector<at::Tensor> BatchedArgs(const Instruction& ins, const AlignedInputs& a,
                                    const VmapLevel* level) {
  const int64_t rows = a.map->rows;
  std::vector<at::Tensor> args(a.rows.size());
  for (size_t i = 0; i < args.size(); ++i) {
    at::Tensor t = a.rows[i];
    if (ins.contiguous_inputs) t = t.contiguous();  // it reads strides (view_aliasing.h)
    if (!a.batched[i] && ins.mutable_input[i]) {
      // Written per row: each row writes its own copy (CallKernel clones it).
      std::vector<int64_t> shape{rows};
      shape.insert(shape.end(), t.sizes().begin(), t.sizes().end());
      t = t.unsqueeze(0).expand(shape);
    } else if (!a.batched[i]) {
      args[i] = t;  // the same for every row: broadcast
      continue;
    }
    args[i] = level ? level->Batched(t) : t;
  }
  return args;
}

std::vector<Stacked> RunElementwise(const Instruction& ins, const AlignedInputs& a,
                                    const std::vector<ir::ScalarValue>& scalars) {
  const int64_t rows = a.map->rows, n = a.map->num_devices();
  std::vector<at::Tensor> outs = CallKernel(ins, BatchedArgs(ins, a, nullptr), scalars, 0);
  std::vector<Stacked> results(outs.size());
  for (size_t o = 0; o < outs.size(); ++o) {
    if (!outs[o].defined()) continue;
    const int64_t rank = ins.node->output(o).rank();
    if (outs[o].dim() == rank + 1 && outs[o].size(0) == rows) results[o] = Stacked{outs[o], a.map};
    else if (outs[o].dim() == rank) results[o] = StackReplicated(outs[o], n);
    else SPMD_FAIL("internal error: ", ins.node->op()->qualified, " on stacked rows gave shape ",
                   outs[o].sizes());
  }
  return results;
}

std::vector<Stacked> RunVmapped(const Instruction& ins, const AlignedInputs& a,
                                const std::vector<ir::ScalarValue>& scalars) {
  const int64_t rows = a.map->rows, n = a.map->num_devices();
  VmapLevel level(rows);
  std::vector<at::Tensor> args = BatchedArgs(ins, a, &level);
  const bool as_view = ins.view_kernel != nullptr;
  std::vector<at::Tensor> outs = CallKernel(ins, std::move(args), scalars, 0, as_view);
  level.Pop();
  std::vector<Stacked> results(outs.size());
  for (size_t o = 0; o < outs.size(); ++o) {
    if (!outs[o].defined()) continue;
    at::Tensor per_row = level.Rows(outs[o]);
    if (!per_row.defined()) per_row = outs[o].unsqueeze(0);  // the same for every row
    // A view's result is the input's memory: copy it, as the `_copy` op would.
    if (as_view) per_row = per_row.clone(at::MemoryFormat::Contiguous);
    results[o] = per_row.size(0) == rows ? Stacked{per_row, a.map}
                                         : Stacked{per_row, ReplicatedMap(n)};
  }
  return results;
}

}  // namespace

AlignedInputs Align(const std::vector<const Stacked*>& inputs,
                    const std::vector<int64_t>* tiles) {
  const int64_t n = DeviceSet::Get().num_devices();
  AlignedInputs a;
  a.rows.resize(inputs.size());
  a.batched.assign(inputs.size(), false);
  // Common case: every input that differs between devices has the same rows.
  RowMapPtr common;
  bool same = tiles == nullptr;
  for (const Stacked* in : inputs) {
    if (in->replicated()) continue;
    if (!common) common = in->map;
    else if (!SameMap(common, in->map)) same = false;
  }
  if (same) {
    a.map = common ? common : ReplicatedMap(n);
  } else {
    // Regroup: one row per distinct combination of the inputs' rows (and tiles).
    std::vector<int64_t> keys;
    int64_t width = tiles ? 1 : 0;
    for (const Stacked* in : inputs) width += !in->replicated();
    keys.reserve(n * width);
    for (int64_t d = 0; d < n; ++d) {
      if (tiles) keys.push_back((*tiles)[d]);
      for (const Stacked* in : inputs)
        if (!in->replicated()) keys.push_back(in->map->row_of[d]);
    }
    a.map = MapOfKeys(keys, width, &a.first_device);
  }
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Stacked& in = *inputs[i];
    a.batched[i] = a.map->rows > 1 && !in.replicated();
    if (!a.batched[i]) a.rows[i] = in.Row(0);
    else a.rows[i] = same ? in.rows : RowsFor(in, *a.map, a.first_device);
  }
  return a;
}

std::optional<std::vector<Stacked>> RunBatched(
                                               const Instruction& ins, const std::vector<const Stacked*>& inputs,
                                               const std::vector<ir::ScalarValue>& scalars) {
  // Inputs that vary alike align without copies: elementwise ops run on them as they are.
  RowMapPtr common;
  bool same = true;
  for (const Stacked* in : inputs) {
    if (in->replicated()) continue;
    if (!common) common = in->map;
    else same &= SameMap(common, in->map);
  }
  std::optional<AlignedInputs> a;
  if (same) {
    a = Align(inputs, nullptr);
    if (CanRunElementwise(ins, *a)) return RunElementwise(ins, *a, scalars);
  }
  // Rows merged into dims: one plain call (inputs varying differently need no copies).
  if (ins.merge.any())
    if (std::optional<MergePlan> plan = PlanMerge(ins.merge, inputs))
      return RunMerged(ins, *plan, inputs, scalars);
  if (!a) {
    a = Align(inputs, nullptr);  // one row per combination of the inputs' rows (copies)
    if (CanRunElementwise(ins, *a)) return RunElementwise(ins, *a, scalars);
  }
  if (!ins.batch_rule) return std::nullopt;
  return RunVmapped(ins, *a, scalars);
}

std::vector<Stacked> RunPerRow(const Instruction& ins, const AlignedInputs& a,
                               const std::vector<ir::ScalarValue>& scalars,
                               const std::vector<int64_t>* tiles) {
  const int64_t rows = a.map->rows, n = a.map->num_devices();
  std::vector<std::vector<at::Tensor>> per_output(ins.outputs.size());
  for (int64_t r = 0; r < rows; ++r) {
    std::vector<at::Tensor> args(a.rows.size());
    for (size_t i = 0; i < args.size(); ++i) {
      args[i] = a.batched[i] ? a.rows[i].select(0, r) : a.rows[i];
      // (Row-exact: every row laid out alike whatever produced it, one row alone or a stack,
      // so a reduction adds its elements in one order in every layout.)
      if (ins.contiguous_inputs || RowExactExecution()) args[i] = args[i].contiguous();
    }
    const int64_t device = a.first_device.empty() ? r : a.first_device[r];
    std::vector<at::Tensor> outs = CallKernel(ins, std::move(args), scalars,
                                              tiles ? (*tiles)[device] : 0);
    for (size_t o = 0; o < outs.size(); ++o) per_output[o].push_back(std::move(outs[o]));
  }
  std::vector<Stacked> results(per_output.size());
  for (size_t o = 0; o < per_output.size(); ++o) {
    if (!per_output[o][0].defined()) continue;
    results[o] = rows == 1 ? StackReplicated(per_output[o][0], n)
                           : Stacked{at::stack(per_output[o]), a.map};
  }
  return results;
}

}  // namespace spmd::runtime
