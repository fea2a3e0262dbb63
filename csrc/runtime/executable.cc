#include "runtime/executable.h"

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <algorithm>
#include <chrono>
#include <mutex>

#include "core/error.h"
#include "core/metrics.h"
#include "ir/internal_attrs.h"
#include "ir/internal_ops.h"
#include "runtime/batched_run.h"
#include "runtime/exchange_schedule.h"
#include "runtime/host_block_pool.h"
#include "runtime/internal_kernels.h"
#include "runtime/kernel_call.h"
#include "runtime/process_span.h"
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

Executable::~Executable() = default;

const Stacked& Executable::StackIn(SlotValue& value) {
  if (!value.stack.defined()) value.stack = StackOf(value.buffers);
  return value.stack;
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
  RunState run{std::vector<SlotValue>(plan_.num_slots), std::vector<bool>(plan_.num_slots, false),
               {}, RunProfile{}, scalars};
  for (size_t i = 0; i < params.size(); ++i) {
    run.slots[plan_.param_slots[i]] = SlotValue{params[i]->shards(), params[i]->stacked()};
    if (!donated.empty() && donated[i]) run.donated_slot[plan_.param_slots[i]] = true;
  }
  run.profile.program = &program_;
  run.profile.seconds.reserve(plan_.instructions.size());
  // The program's kernels compute values, never gradients: skip the autograd and view-tracking
  // kernels every call would otherwise pass through (a view made here is never differentiated).
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  // The devices' buffers come from blocks the previous steps freed (host_block_pool.h).
  PooledHostAllocations pooled;
  // (One process: nothing is deferred, and the schedule tracks no slots.)
  ExchangeSchedule exchanges(span_ ? plan_.num_slots : 0);
  try {
    for (size_t index = 0; index < plan_.instructions.size(); ++index) {
      const Instruction& ins = plan_.instructions[index];
      bool deferred = false;
      RunBatch(exchanges.Next(index, {ins.inputs, ins.outputs, ins.free_after, WritesAnInput(ins),
                                      deferred_exchange_[index]}, &deferred), run);
      if (!deferred) RunInstruction(index, run);
    }
    RunBatch(exchanges.Finish(), run);
  } catch (...) {
    // The step failed: the donated inputs are still needed (their tensors' pending values
    // depend on them). Their host data never left; account their bytes again.
    run.slots.clear();
    for (const BufferPtr& b : run.given_back)
      b->alloc = DeviceSet::Get().Allocate(b->alloc.device(), b->alloc.bytes(),
                                           "input restored after a failed step");
    throw;
  }
  std::vector<DeviceDataPtr> outputs = OutputsOf(run.slots);
  std::lock_guard<std::mutex> lock(ProfileMutex());
  LastProfile() = std::move(run.profile);
  return outputs;
}

void Executable::RunInstruction(size_t index, RunState& run) const {
  const Instruction& ins = plan_.instructions[index];
  run.profile.node_index.push_back(ins.node_index);
  try {
    // All devices at once: each gets the whole time.
    const auto started = std::chrono::steady_clock::now();
    if (ins.node->op()->internal) RunInternalOp(ins, run.slots);
    else RunAtenOp(index, run.slots, run.scalars);
    run.profile.seconds.emplace_back(
        DeviceSet::Get().num_devices(),
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
  FreeDeadSlots(ins, run.donated_slot, run.slots, &run.given_back);
}

void Executable::RunBatch(const ExchangeSchedule::Batch& batch, RunState& run) const {
  if (batch.empty()) return;
  const auto started = std::chrono::steady_clock::now();
  RunDeferredExchanges(batch.exchanges, run.slots);
  const float seconds =
      std::chrono::duration<float>(std::chrono::steady_clock::now() - started).count();
  for (size_t index : batch.exchanges) {
    const Instruction& ins = plan_.instructions[index];
    run.profile.node_index.push_back(ins.node_index);
    run.profile.seconds.emplace_back(DeviceSet::Get().num_devices(),
                                     seconds / batch.exchanges.size());
    FreeDeadSlots(ins, run.donated_slot, run.slots, &run.given_back);
  }
  for (size_t index : batch.readers) RunInstruction(index, run);
}

std::vector<DeviceDataPtr> Executable::OutputsOf(std::vector<SlotValue>& slots) const {
  std::vector<DeviceDataPtr> outputs;
  outputs.reserve(plan_.output_slots.size());
  for (size_t i = 0; i < plan_.output_slots.size(); ++i) {
    SlotValue& slot = slots[plan_.output_slots[i]];
    if (slot.stack.defined()) AttachViews(slot.stack, slot.buffers);
    outputs.push_back(std::make_shared<DeviceData>(program_.output_global_types[i],
                                                   program_.output_shardings[i], slot.buffers,
                                                   slot.stack));
  }
  return outputs;
}

RunProfile LastRunProfile() {
  std::lock_guard<std::mutex> lock(ProfileMutex());
  return LastProfile();
}

}  // namespace spmd::runtime
