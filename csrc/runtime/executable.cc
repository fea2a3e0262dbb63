#include "runtime/executable.h"

#include <ATen/ATen.h>
#include <ATen/TensorUtils.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <algorithm>
#include <mutex>
#include <chrono>
#include <map>
#include <unordered_map>
#include <unordered_set>

#include "core/error.h"
#include "core/metrics.h"
#include "ir/internal_attrs.h"
#include "ir/internal_ops.h"
#include "runtime/host_block_pool.h"
#include "runtime/process_span.h"
#include "runtime/internal_kernels.h"
#include "runtime/row_merge.h"
#include "runtime/span_kernels.h"

namespace spmd::runtime {

namespace {
std::mutex& ProfileMutex() {
  static auto* mu = new std::mutex();
  return *mu;
}
RunProfile& LastProfile() {
  static auto* profile = new RunProfile();
  return *profile;
}
}  // namespace


namespace {

c10::Scalar ToScalar(const ir::ScalarValue& v) {
  switch (v.kind) {
    case ir::Arg::Kind::kScalarInt: return c10::Scalar(v.i);
    case ir::Arg::Kind::kScalarBool: return c10::Scalar(static_cast<bool>(v.i));
    default: return c10::Scalar(v.d);
  }
}

// Tile 0 keeps the recorded seed (an unsharded random op draws what it drew before); other
// tiles get well-separated seeds.
uint64_t TileSeedOffset(int64_t tile) { return static_cast<uint64_t>(tile) * 0x9E3779B97F4A7C15ULL; }

// The instruction's prebuilt stack with this call's tensors (written inputs replaced by private
// copies, appended to `written` in argument order) and run-time scalars filled in.
std::vector<c10::IValue> FilledStack(const Instruction& ins, std::vector<at::Tensor>& args,
                                     const std::vector<ir::ScalarValue>& scalars, int64_t tile,
                                     std::vector<at::Tensor>* written) {
  std::vector<c10::IValue> stack = ins.stack;
  for (const auto& [pos, input] : ins.tensor_args) {
    at::Tensor& t = args[input];
    if (ins.mutable_input[input]) {
      t = t.clone();  // values are immutable: never write a live buffer
      written->push_back(t);
    }
    stack[pos] = c10::IValue(t);
  }
  for (const auto& la : ins.list_args) {
    if (la.optional) {
      c10::List<c10::optional<at::Tensor>> list;
      for (int64_t i : la.inputs) list.push_back(i < 0 ? c10::optional<at::Tensor>() : args[i]);
      stack[la.position] = c10::IValue(list);
    } else {
      c10::List<at::Tensor> list;
      for (int64_t i : la.inputs) list.push_back(args[i]);
      stack[la.position] = c10::IValue(list);
    }
  }
  for (const auto& sa : ins.scalar_args) {
    if (sa.generator) {
      // The seed the recorder drew for this random op: same values on every run.
      stack[sa.position] = c10::IValue(at::make_generator<at::CPUGeneratorImpl>(
          static_cast<uint64_t>(scalars.at(sa.scalar_index).i) + TileSeedOffset(tile)));
      continue;
    }
    if (sa.list_size >= 0) {
      c10::impl::GenericList list(c10::NumberType::get());
      list.reserve(sa.list_size);
      for (int e = 0; e < sa.list_size; ++e)
        list.push_back(c10::IValue(ToScalar(scalars.at(sa.scalar_index + e))));
      stack[sa.position] = c10::IValue(std::move(list));
      continue;
    }
    c10::Scalar s = ToScalar(scalars.at(sa.scalar_index));
    stack[sa.position] = ScalarIValue(s, sa.wrapped);
  }
  return stack;
}

// Calls `kernel` on `stack`; a random op without a Generator argument draws from the default
// CPU generator reseeded with its recorded seed (per tile).
void CallSeeded(const c10::OperatorHandle& kernel, const Instruction& ins,
                const std::vector<ir::ScalarValue>& scalars, int64_t tile,
                std::vector<c10::IValue>* stack) {
  if (ins.default_generator_seed >= 0) {
    // Reseed the default CPU generator with the recorded seed for this kernel only, so the
    // node draws the same values on every run, and restore it: replay must not perturb the
    // host's random stream.
    at::Generator gen = at::detail::getDefaultCPUGenerator();
    at::Tensor saved;
    {
      std::lock_guard<std::mutex> lock(gen.mutex());
      saved = gen.get_state();
      gen.set_current_seed(static_cast<uint64_t>(scalars.at(ins.default_generator_seed).i) +
                           TileSeedOffset(tile));
    }
    auto restore = [&] {
      std::lock_guard<std::mutex> lock(gen.mutex());
      gen.set_state(saved);
    };
    try {
      kernel.callBoxed(stack);
    } catch (...) {
      restore();
      throw;
    }
    restore();
  } else {
    kernel.callBoxed(stack);
  }
}

// The kernel's results as the node's outputs (undefined where the program expects none).
std::vector<at::Tensor> KernelOutputs(const Instruction& ins, std::vector<c10::IValue>& stack,
                                      const std::vector<at::Tensor>& written) {
  const ir::Node& node = *ins.node;
  // Flatten the returns (a Tensor[] return contributes all its elements).
  std::vector<at::Tensor> outs;
  for (c10::IValue& r : stack) {
    if (r.isTensor()) outs.push_back(r.toTensor());
    else if (r.isNone()) outs.emplace_back();  // an optional return left empty
    else if (r.isTensorList())
      for (at::Tensor t : r.toTensorList()) outs.push_back(t);
  }
  // Written inputs that no return carries (native_batch_norm's running stats) are extra
  // outputs, in argument order (the recorder gave the node one output per such argument).
  for (const at::Tensor& w : written) {
    bool returned = false;
    for (const at::Tensor& o : outs) returned |= o.defined() && o.is_same(w);
    if (!returned) outs.push_back(w);
  }
  SPMD_CHECK(outs.size() == ins.outputs.size(), node.op()->qualified, " returned ", outs.size(),
             " tensors but ", ins.outputs.size(), " were expected");
  for (size_t o = 0; o < outs.size(); ++o) {
    if (node.output(o).dtype != DType::kUndefined) continue;
    // An output the recorder knew would be undefined (convolution_backward and
    // native_layer_norm_backward with an output_mask entry false): nothing to keep.
    SPMD_CHECK(!outs[o].defined() || outs[o].numel() == 0, "internal error: ",
               node.op()->qualified, " produced output ", o, " where the program expects none");
    outs[o] = at::Tensor();
  }
  return outs;
}

}  // namespace

Executable::Executable(partition::Program program)
    : program_(std::move(program)),
      plan_(PlanExecution(program_)),
      unbatchable_(new std::atomic<bool>[plan_.instructions.size()]) {
  for (size_t i = 0; i < plan_.instructions.size(); ++i) unbatchable_[i] = false;
  span_ = ProcessSpan::Current();
  deferred_exchange_.assign(plan_.instructions.size(), false);
  chained_exchange_.assign(plan_.instructions.size(), false);
  if (span_ && span_->process_count() > 1)
    for (size_t i = 0; i < plan_.instructions.size(); ++i) {
      const Instruction& ins = plan_.instructions[i];
      deferred_exchange_[i] = ins.node->op()->internal && ins.stacked_kernel &&
                              ins.inputs.size() == 1 && ins.outputs.size() == 1 &&
                              ExchangesAcrossProcesses(*ins.node, *span_);
      chained_exchange_[i] = deferred_exchange_[i] && ChainsAcrossProcesses(*ins.node, *span_);
    }
}

void Executable::RunDeferredExchanges(std::vector<size_t>& deferred,
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

Executable::~Executable() = default;

const Stacked& Executable::StackIn(SlotValue& value) {
  if (!value.stack.defined()) value.stack = StackOf(value.buffers);
  return value.stack;
}

Executable::Aligned Executable::Align(const std::vector<const Stacked*>& inputs,
                                      const std::vector<int64_t>* tiles) const {
  const int64_t n = DeviceSet::Get().num_devices();
  Aligned a;
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

std::vector<at::Tensor> Executable::CallKernel(const Instruction& ins, std::vector<at::Tensor> args,
                                               const std::vector<ir::ScalarValue>& scalars,
                                               int64_t tile, bool as_view) const {
  std::vector<at::Tensor> written;
  std::vector<c10::IValue> stack = FilledStack(ins, args, scalars, tile, &written);
  CallSeeded(as_view ? *ins.view_kernel : KernelFor(ins.node->op()), ins, scalars, tile, &stack);
  return KernelOutputs(ins, stack, written);
}

bool Executable::CanRunElementwise(const Instruction& ins, const Aligned& a) const {
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

std::vector<Stacked> Executable::RunMerged(const Instruction& ins, const MergePlan& plan,
                                           const std::vector<const Stacked*>& inputs,
                                           const std::vector<ir::ScalarValue>& scalars) const {
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

std::optional<std::vector<Stacked>> Executable::RunBatched(
    const Instruction& ins, const std::vector<const Stacked*>& inputs,
    const std::vector<ir::ScalarValue>& scalars) const {
  // Inputs that vary alike align without copies: elementwise ops run on them as they are.
  RowMapPtr common;
  bool same = true;
  for (const Stacked* in : inputs) {
    if (in->replicated()) continue;
    if (!common) common = in->map;
    else same &= SameMap(common, in->map);
  }
  std::optional<Aligned> a;
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

std::vector<at::Tensor> Executable::BatchedArgs(const Instruction& ins, const Aligned& a,
                                                const VmapLevel* level) const {
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

std::vector<Stacked> Executable::RunElementwise(const Instruction& ins, const Aligned& a,
                                                const std::vector<ir::ScalarValue>& scalars) const {
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

std::vector<Stacked> Executable::RunVmapped(const Instruction& ins, const Aligned& a,
                                            const std::vector<ir::ScalarValue>& scalars) const {
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

std::vector<Stacked> Executable::RunPerRow(const Instruction& ins, const Aligned& a,
                                           const std::vector<ir::ScalarValue>& scalars,
                                           const std::vector<int64_t>* tiles) const {
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

void Executable::StoreResults(const Instruction& ins, std::vector<Stacked> results,
                              std::vector<SlotValue>& slots) const {
  const ir::Node& node = *ins.node;
  SPMD_CHECK(results.size() == ins.outputs.size(), node.op()->qualified, " produced ",
             results.size(), " outputs, expected ", ins.outputs.size());
  for (size_t o = 0; o < results.size(); ++o) {
    const TensorType& want = node.output(o);
    if (want.dtype == DType::kUndefined) continue;
    const Stacked& r = results[o];
    SPMD_CHECK(r.defined(), "internal error: ", node.op()->qualified, " produced no output ", o,
               " where the program expects ", want.ToString());
    c10::IntArrayRef got = r.rows.sizes().slice(1);
    SPMD_CHECK(std::equal(got.begin(), got.end(), want.shape.begin(), want.shape.end()) &&
                   FromScalarType(r.rows.scalar_type()) == want.dtype,
               "internal error: ", node.op()->qualified, " produced ",
               TypeOf(r.Row(0)).ToString(), " where the program expects ", want.ToString());
    SlotValue& slot = slots[ins.outputs[o]];
    slot.buffers = ins.on_host ? HostBuffersOf(r, ins.labels[o])
                               : BuffersOf(r, ins.labels[o], nullptr, /*views=*/false);
    slot.stack = std::move(results[o]);
  }
}

void Executable::RunAtenOp(size_t index, std::vector<SlotValue>& slots,
                           const std::vector<ir::ScalarValue>& scalars) const {
  const Instruction& ins = plan_.instructions[index];
  if (ins.alias != ViewKind::kNone && TryAliasInput(ins, slots, scalars)) return;
  const ir::Node& node = *ins.node;
  std::vector<const Stacked*> inputs;
  inputs.reserve(ins.inputs.size());
  for (int s : ins.inputs) inputs.push_back(&StackIn(slots[s]));

  // A random op must draw different values for different tiles of its result: its devices
  // are told apart by the tile they hold as well, and each tile reseeds differently.
  std::vector<int64_t> tiles;
  if (ins.random && !node.shardings().empty() && node.shardings()[0].valid()) {
    const Sharding& layout = node.shardings()[0];
    const int64_t n = DeviceSet::Get().num_devices(), first = FirstLocalDevice();
    tiles.resize(n);
    for (int64_t d = 0; d < n; ++d) {
      int64_t tile = 0;
      for (int64_t dim = 0; dim < layout.rank(); ++dim)
        tile = tile * layout.NumTiles(dim) + layout.TileIndex(dim, first + d);
      tiles[d] = tile;
    }
  }
  if (ins.sums_over && std::any_of(inputs.begin(), inputs.end(),
                                   [](const Stacked* in) { return in->summed; })) {
    StoreResults(ins, RunOnGroupSums(ins, inputs, scalars), slots);
    return;
  }
  if (ins.fold)
    if (std::optional<std::vector<Stacked>> folded = RunFolded(ins, inputs, scalars)) {
      StoreResults(ins, std::move(*folded), slots);
      return;
    }
  const std::vector<int64_t>* tile_of = tiles.empty() ? nullptr : &tiles;
  bool varies = tile_of != nullptr;
  for (const Stacked* in : inputs) varies |= !in->replicated();
  std::optional<std::vector<Stacked>> results;
  if (varies && !ins.random && !unbatchable_[index].load(std::memory_order_relaxed) &&
      !RowExactExecution()) {
    try {
      results = RunBatched(ins, inputs, scalars);
    } catch (const std::exception&) {
      // It cannot run batched here: run it per row. Only an op that then succeeds is
      // remembered as unbatchable (a genuine error, e.g. an index out of range, rethrows).
      results = RunPerRow(ins, Align(inputs, tile_of), scalars, tile_of);
      unbatchable_[index] = true;
      Count("UnbatchedOps");
    }
  }
  if (!results) {
    // Once (every device alike), per tile (random), or per row (no batching rule).
    if (varies && !ins.random) Count("UnbatchedOps");
    results = RunPerRow(ins, Align(inputs, tile_of), scalars, tile_of);
  }
  // A view of a summed value (on its way to the reduction) is summed too.
  if (ins.alias != ViewKind::kNone && inputs[0]->summed) (*results)[0].summed = true;
  StoreResults(ins, std::move(*results), slots);
}

void Executable::RunInternalOp(const Instruction& ins, std::vector<SlotValue>& slots) const {
  const ir::Node& node = *ins.node;
  if (ins.stacked_kernel || ins.on_host) {
    SPMD_CHECK(ins.stacked_kernel, "internal error: ", node.op()->qualified,
               " has no stacked kernel");
    std::vector<const Stacked*> inputs;
    for (int s : ins.inputs) inputs.push_back(&StackIn(slots[s]));
    StoreResults(ins, (*ins.stacked_kernel)(node, inputs), slots);
    return;
  }
  std::vector<const PerDevice*> inputs;
  for (int s : ins.inputs) {
    if (slots[s].stack.defined()) AttachViews(slots[s].stack, slots[s].buffers);
    inputs.push_back(&slots[s].buffers);
  }
  std::vector<PerDevice> outs = (*ins.internal_kernel)(node, inputs);
  SPMD_CHECK(outs.size() == ins.outputs.size(), node.op()->qualified, " produced ", outs.size(),
             " outputs, expected ", ins.outputs.size());
  for (size_t o = 0; o < outs.size(); ++o) slots[ins.outputs[o]] = SlotValue{std::move(outs[o]), {}};
}

std::vector<Stacked> Executable::RunOnGroupSums(const Instruction& ins,
                                                const std::vector<const Stacked*>& inputs,
                                                const std::vector<ir::ScalarValue>& scalars) const {
  const FoldPlan& plan = *ins.sums_over;
  Grouped g = ByGroup(inputs, plan.groups);
  const int64_t k = plan.groups.group_size();
  std::vector<at::Tensor> sums(inputs.size());  // per operand, [U, ...]
  for (size_t i = 0; i < inputs.size(); ++i) {
    const at::Tensor& t = g.rows[i];  // [U, k, ...]
    if (inputs[i]->summed) sums[i] = t.select(1, 0);  // each member holds the group's sum
    else if (t.size(1) == 1 || t.stride(1) == 0) sums[i] = t.select(1, 0) * k;
    else sums[i] = t.sum(1);
  }
  std::vector<Stacked> per_group = RunPerGroup(ins, std::move(sums), g.group_map, scalars);
  Count("GroupSumOps");
  return UnfoldResults(plan, g, per_group);
}

std::vector<Stacked> Executable::RunPerGroup(const Instruction& ins, std::vector<at::Tensor> rows,
                                             const RowMapPtr& map,
                                             const std::vector<ir::ScalarValue>& scalars) const {
  const int64_t n = map->num_devices();
  if (ins.contiguous_inputs)
    for (at::Tensor& r : rows) r = r.contiguous();
  std::vector<Stacked> per_group;
  if (map->rows == 1) {
    std::vector<at::Tensor> args(rows.size());
    for (size_t i = 0; i < rows.size(); ++i) args[i] = rows[i].select(0, 0);
    for (at::Tensor& out : CallKernel(ins, std::move(args), scalars, 0))
      per_group.push_back(out.defined() ? StackReplicated(out, n) : Stacked{});
    return per_group;
  }
  // One row per group: run stacked like any op (an operand alike in every group, a weight
  // read by each group, passes as it is).
  std::vector<Stacked> stacks(rows.size());
  std::vector<const Stacked*> per_operand(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    stacks[i] = rows[i].stride(0) == 0 ? StackReplicated(rows[i].select(0, 0), n)
                                        : Stacked{rows[i], map};
    per_operand[i] = &stacks[i];
  }
  std::optional<std::vector<Stacked>> out = RunBatched(ins, per_operand, scalars);
  return out ? std::move(*out) : RunPerRow(ins, Align(per_operand, nullptr), scalars, nullptr);
}

std::optional<std::vector<Stacked>> Executable::RunFolded(
    const Instruction& ins, const std::vector<const Stacked*>& inputs,
    const std::vector<ir::ScalarValue>& scalars) const {
  std::optional<FoldedOperands> folded = FoldOperands(*ins.fold, inputs);
  if (!folded) return std::nullopt;
  std::vector<Stacked> per_group =
      RunPerGroup(ins, std::move(folded->rows), folded->grouped.group_map, scalars);
  Count("FoldedContractions");
  return UnfoldResults(*ins.fold, folded->grouped, per_group);
}

bool Executable::TryAliasInput(const Instruction& ins, std::vector<SlotValue>& slots,
                               const std::vector<ir::ScalarValue>& scalars) const {
  int in = ins.inputs[0];
  SlotValue& input = slots[in];
  const Stacked& s = StackIn(input);
  SlotValue out;
  if (ins.alias == ViewKind::kReshape) {
    // A reshape views each row: a contiguous row always, a strided one (a value whose rows
    // were split from a merged call, laid out as that call wrote them) when its strides
    // allow it.
    if (!s.Row(0).is_contiguous()) {
      std::vector<int64_t> shape{s.rows.size(0)};
      const Shape& result = ins.node->output(0).shape;
      shape.insert(shape.end(), result.begin(), result.end());
      if (!at::detail::computeStride(s.rows.sizes(), s.rows.strides(), shape)) return false;
    }
    out.stack = Stacked{ReshapedView(*ins.node, s.rows, /*batch_dims=*/1), s.map};
  } else {
    at::Tensor rows = ViewOfRows(ins, s, scalars);
    if (!rows.defined()) return false;
    out.stack = Stacked{std::move(rows), s.map};
  }
  out.stack.summed = s.summed;
  const bool dies = std::find(ins.free_after.begin(), ins.free_after.end(), in) != ins.free_after.end();
  if (!dies && ins.share_input) {  // the input's bytes hold it: nothing to charge
    out.buffers = UnchargedBuffersOf(out.stack);
    Count("SharedViews");
  } else if (dies && ins.alias != ViewKind::kSubset && CanTakeOver(input)) {
    // The input dies here: the view takes over its bytes.
    out.buffers = BuffersOf(out.stack, ins.labels[0], &input.buffers, /*views=*/false);
    Count("AliasedViews");
  } else {
    // Borrowed: the input's host memory, charged as the copy it stands for (view_aliasing.h).
    out.buffers = BuffersOf(out.stack, ins.labels[0], nullptr, /*views=*/false);
    Count("BorrowedViews");
  }
  slots[ins.outputs[0]] = std::move(out);
  return true;
}

// The op's view kernel (transpose for transpose_copy, ...) on every row of `s` at once: the
// kernel on row 0 says where its view lies in that row (sizes, strides, offset), and every row
// is laid out alike, one row stride apart. Undefined when the kernel made no view of its input.
at::Tensor Executable::ViewOfRows(const Instruction& ins, const Stacked& s,
                                  const std::vector<ir::ScalarValue>& scalars) const {
  const at::Tensor row = s.rows.select(0, 0);
  std::vector<at::Tensor> outs = CallKernel(ins, {row}, scalars, 0, /*as_view=*/true);
  const at::Tensor& view = outs.at(0);
  if (!view.defined() || !view.is_alias_of(row)) return {};
  std::vector<int64_t> sizes{s.rows.size(0)}, strides{s.rows.stride(0)};
  sizes.insert(sizes.end(), view.sizes().begin(), view.sizes().end());
  strides.insert(strides.end(), view.strides().begin(), view.strides().end());
  return s.rows.as_strided(sizes, strides, view.storage_offset());
}

bool Executable::CanTakeOver(const SlotValue& input) {
  for (const BufferPtr& b : input.buffers) {
    // (An uncharged input, itself a shared view, has no bytes to hand over.)
    if (!b || !b->alloc.active()) return false;
    // Nobody outside this slot may hold the buffer (a live tensor, another slot). Devices of a
    // value share one allocation block, so count this slot's own references to it.
    long own = 0;
    for (const BufferPtr& other : input.buffers)
      own += !b.owner_before(other) && !other.owner_before(b);
    if (b.use_count() != own) return false;
  }
  return true;
}

void Executable::FreeDeadSlots(const Instruction& ins, const std::vector<bool>& donated_slot,
                               std::vector<SlotValue>& slots, std::vector<BufferPtr>* given_back) {
  for (int s : ins.free_after) {
    if (donated_slot[s])  // a donated input gives its device memory back (restored on failure)
      for (const BufferPtr& b : slots[s].buffers)
        if (b && b->alloc.active()) {
          b->alloc.Release();
          given_back->push_back(b);
        }
    slots[s] = SlotValue();
  }
}

std::vector<DeviceDataPtr> Executable::Run(const std::vector<DeviceDataPtr>& params,
                                           const std::vector<ir::ScalarValue>& scalars,
                                           const std::vector<bool>& donated) const {
  SPMD_CHECK(params.size() == plan_.param_slots.size(), "program expects ", plan_.param_slots.size(),
             " parameters, got ", params.size());
  SPMD_CHECK(donated.empty() || donated.size() == params.size(), "program expects ",
             params.size(), " donation flags, got ", donated.size());
  // Slots own their buffers; everything still allocated is released if a kernel throws.
  std::vector<SlotValue> slots(plan_.num_slots);
  std::vector<bool> donated_slot(plan_.num_slots, false);
  for (size_t i = 0; i < params.size(); ++i) {
    slots[plan_.param_slots[i]] = SlotValue{params[i]->shards(), params[i]->stacked()};
    if (!donated.empty() && donated[i]) donated_slot[plan_.param_slots[i]] = true;
  }
  // Donated inputs whose device memory was given back; taken back if the run fails.
  std::vector<BufferPtr> given_back;
  RunProfile profile;
  profile.program = &program_;
  profile.seconds.reserve(plan_.instructions.size());
  const size_t num_devices = DeviceSet::Get().num_devices();
  // The program's kernels compute values, never gradients: skip the autograd and view-tracking
  // kernels every call would otherwise pass through (a view made here is never differentiated).
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  // The devices' buffers come from blocks the previous steps freed (host_block_pool.h).
  PooledHostAllocations pooled;
  // Runs instruction `index` and frees what it read last.
  auto run_one = [&](size_t index) {
    const Instruction& ins = plan_.instructions[index];
    profile.node_index.push_back(ins.node_index);
    try {
      // All devices at once: each gets the whole time.
      const auto started = std::chrono::steady_clock::now();
      if (ins.node->op()->internal) RunInternalOp(ins, slots);
      else RunAtenOp(index, slots, scalars);
      profile.seconds.emplace_back(
          num_devices,
          std::chrono::duration<float>(std::chrono::steady_clock::now() - started).count());
    } catch (c10::Error& e) {
      // Name the op that failed (the type, e.g. IndexError, is kept).
      e.add_context("while running " + ins.node->op()->qualified + " of the compiled program");
      throw;
    } catch (const OutOfMemoryError&) {
      throw;  // already names the device, the bytes and the buffer
    } catch (const std::exception& e) {
      TORCH_CHECK(false, e.what(), " (while running ", ins.node->op()->qualified,
                  " of the compiled program)");
    }
    FreeDeadSlots(ins, donated_slot, slots, &given_back);
  };
  // Multi-process SPMD: collectives across processes wait to exchange together (one call for
  // many), and so do the instructions that read their results (run after them, in program
  // order). `awaited`: the slots they will fill; `held`: the slots they read. They all run
  // before an instruction frees a held slot or writes into an input (or reads an awaited slot
  // and cannot wait, as it writes into an input), and at the end: a step exchanges once per
  // level of dependent collectives (the gradients of a data-parallel step: once).
  std::vector<size_t> deferred, deferred_readers;
  const size_t tracked = span_ ? plan_.num_slots : 0;  // (one process: nothing is deferred)
  std::vector<bool> awaited(tracked, false), held(tracked, false);
  auto run_deferred = [&] {
    const auto started = std::chrono::steady_clock::now();
    RunDeferredExchanges(deferred, slots);
    const float seconds =
        std::chrono::duration<float>(std::chrono::steady_clock::now() - started).count();
    for (size_t index : deferred) {
      const Instruction& ins = plan_.instructions[index];
      profile.node_index.push_back(ins.node_index);
      profile.seconds.emplace_back(num_devices, seconds / deferred.size());
      FreeDeadSlots(ins, donated_slot, slots, &given_back);
    }
    for (size_t index : deferred_readers) run_one(index);
    deferred.clear();
    deferred_readers.clear();
    std::fill(awaited.begin(), awaited.end(), false);
    std::fill(held.begin(), held.end(), false);
  };
  try {
    for (size_t index = 0; index < plan_.instructions.size(); ++index) {
      const Instruction& ins = plan_.instructions[index];
      if (!deferred.empty()) {
        const bool reads_awaited =
            std::any_of(ins.inputs.begin(), ins.inputs.end(), [&](int s) { return awaited[s]; });
        if (reads_awaited && !WritesAnInput(ins) && !deferred_exchange_[index]) {
          deferred_readers.push_back(index);
          for (int o : ins.outputs) awaited[o] = true;
          for (int in : ins.inputs) held[in] = true;
          continue;
        }
        if (reads_awaited || WritesAnInput(ins) ||
            std::any_of(ins.free_after.begin(), ins.free_after.end(),
                        [&](int s) { return held[s]; }))
          run_deferred();
      }
      if (deferred_exchange_[index]) {
        deferred.push_back(index);
        awaited[ins.outputs[0]] = true;
        held[ins.inputs[0]] = true;
        continue;
      }
      run_one(index);
    }
    run_deferred();
  } catch (...) {
    // The step failed: the donated inputs are still needed (their tensors' pending values
    // depend on them). Their host data never left; account their bytes again.
    slots.clear();
    for (const BufferPtr& b : given_back)
      b->alloc = DeviceSet::Get().Allocate(b->alloc.device(), b->alloc.bytes(),
                                           "input restored after a failed step");
    throw;
  }
  std::vector<DeviceDataPtr> outputs;
  outputs.reserve(plan_.output_slots.size());
  for (size_t i = 0; i < plan_.output_slots.size(); ++i) {
    SlotValue& slot = slots[plan_.output_slots[i]];
    if (slot.stack.defined()) AttachViews(slot.stack, slot.buffers);
    outputs.push_back(std::make_shared<DeviceData>(program_.output_global_types[i],
                                                   program_.output_shardings[i], slot.buffers,
                                                   slot.stack));
  }
  {
    std::lock_guard<std::mutex> lock(ProfileMutex());
    LastProfile() = std::move(profile);
  }
  return outputs;
}

RunProfile LastRunProfile() {
  std::lock_guard<std::mutex> lock(ProfileMutex());
  return LastProfile();
}

}  // namespace spmd::runtime
