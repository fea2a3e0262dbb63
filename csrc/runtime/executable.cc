#include "runtime/executable.h"

#include <ATen/ATen.h>
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
#include "ir/internal_ops.h"
#include "runtime/internal_kernels.h"

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

const c10::OperatorHandle& KernelFor(const ir::OpInfo* op) {
  void* cached = op->backend.load(std::memory_order_acquire);
  if (cached) return *static_cast<const c10::OperatorHandle*>(cached);
  auto handle = c10::Dispatcher::singleton().findSchemaOrThrow(op->name.c_str(),
                                                               op->overload.c_str());
  auto* owned = new c10::OperatorHandle(handle);  // lives as long as the op registry
  void* expected = nullptr;
  if (!op->backend.compare_exchange_strong(expected, owned)) delete owned;
  return *static_cast<const c10::OperatorHandle*>(op->backend.load());
}

c10::Scalar ToScalar(const ir::Arg& a) {
  switch (a.kind) {
    case ir::Arg::Kind::kScalarInt: return c10::Scalar(a.i);
    case ir::Arg::Kind::kScalarBool: return c10::Scalar(static_cast<bool>(a.i));
    default: return c10::Scalar(a.d);
  }
}

c10::Scalar ToScalar(const ir::ScalarValue& v) {
  switch (v.kind) {
    case ir::Arg::Kind::kScalarInt: return c10::Scalar(v.i);
    case ir::Arg::Kind::kScalarBool: return c10::Scalar(static_cast<bool>(v.i));
    default: return c10::Scalar(v.d);
  }
}

at::Tensor WrappedNumber(const c10::Scalar& s) {
  at::Tensor t = at::scalar_to_tensor(s);
  t.unsafeGetTensorImpl()->set_wrapped_number(true);
  return t;
}

// The IValue for a constant (non-tensor, non-dynamic) argument.
c10::IValue ConstantIValue(const ir::Arg& a) {
  using K = ir::Arg::Kind;
  switch (a.kind) {
    case K::kNone: return c10::IValue();
    case K::kBool: return c10::IValue(static_cast<bool>(a.i));
    case K::kInt: return c10::IValue(a.i);
    case K::kDouble: return c10::IValue(a.d);
    case K::kIntList: return c10::IValue(a.ints);
    case K::kDoubleList: return c10::IValue(a.doubles);
    case K::kBoolList: {
      c10::List<bool> l;
      for (int64_t v : a.ints) l.push_back(v != 0);
      return c10::IValue(l);
    }
    case K::kString: return c10::IValue(a.s);
    case K::kScalarInt:
    case K::kScalarDouble:
    case K::kScalarBool:
      return a.wrapped ? c10::IValue(WrappedNumber(ToScalar(a))) : c10::IValue(ToScalar(a));
    case K::kScalarType:
    case K::kLayout:
    case K::kMemoryFormat: return c10::IValue(a.i);
    case K::kDevice: return c10::IValue(c10::Device(c10::kCPU));
    default: return c10::IValue();  // tensors are filled in per run
  }
}

// Tile 0 keeps the recorded seed (an unsharded random op draws what it drew before); other
// tiles get well-separated seeds.
uint64_t TileSeedOffset(int64_t tile) { return static_cast<uint64_t>(tile) * 0x9E3779B97F4A7C15ULL; }

bool SameAcrossDevices(const std::vector<const PerDevice*>& inputs, size_t num_devices) {
  for (const PerDevice* in : inputs)
    for (size_t d = 1; d < num_devices; ++d)
      if ((*in)[d]->tensor.unsafeGetTensorImpl() != (*in)[0]->tensor.unsafeGetTensorImpl())
        return false;
  return true;
}


}  // namespace

Executable::Executable(partition::Program program) : program_(std::move(program)) { Lower(); }

void Executable::Lower() {
  std::unordered_map<const ir::Node*, int> first_slot;  // node -> slot of its output 0
  for (const ir::NodePtr& n : program_.nodes) {
    first_slot[n.get()] = num_slots_;
    num_slots_ += n->num_outputs();
  }
  auto slot_of = [&](const ir::Value& v) { return first_slot.at(v.node.get()) + v.index; };
  for (const ir::NodePtr& p : program_.params) param_slots_.push_back(slot_of(ir::Value{p, 0}));
  for (const ir::Value& v : program_.outputs) output_slots_.push_back(slot_of(v));

  const ir::OpInfo* data_op = ir::InternalOps::Get().device_data;
  for (const ir::NodePtr& n : program_.nodes) {
    if (n->op() == data_op) continue;
    Instruction ins;
    ins.node = n.get();
    ins.node_index = static_cast<int>(&n - program_.nodes.data());
    for (const ir::Value& v : n->inputs()) ins.inputs.push_back(slot_of(v));
    for (int o = 0; o < n->num_outputs(); ++o) ins.outputs.push_back(first_slot.at(n.get()) + o);
    if (!n->op()->internal) {
      KernelFor(n->op());  // resolve the kernel now, so a missing op fails at compile time
      const auto& schema_args = n->op()->args;
      for (size_t a = 0; a < n->args().size(); ++a) {
        const ir::Arg& arg = n->args()[a];
        int pos = static_cast<int>(a);
        using K = ir::Arg::Kind;
        if (a >= schema_args.size()) {
          // The seed the recorder appended for a random op without a Generator argument.
          SPMD_CHECK(arg.dynamic, "unexpected extra argument of ", n->op()->qualified);
          SPMD_CHECK(arg.slot >= 0, "internal error: run-time seed without a slot in ",
                     n->op()->qualified);
          ins.default_generator_seed = arg.slot;
          continue;
        }
        if (arg.kind == K::kTensor) {
          ins.tensor_args.emplace_back(pos, static_cast<int>(arg.i));
          if (a < schema_args.size() && schema_args[a].is_write)
            ins.mutable_inputs.push_back(static_cast<int>(arg.i));
        } else if (arg.kind == K::kTensorList || arg.kind == K::kOptTensorList) {
          ins.list_args.push_back({pos, arg.ints, arg.kind == K::kOptTensorList});
        } else if (arg.dynamic) {
          SPMD_CHECK(arg.slot >= 0, "internal error: run-time scalar without a slot in ",
                     n->op()->qualified);
          bool generator = a < schema_args.size() && schema_args[a].type == ir::ArgType::kGenerator;
          ins.scalar_args.push_back({pos, arg.slot, arg.wrapped, generator});
        }
        ins.stack.push_back(ConstantIValue(arg));
      }
    }
    for (int o = 0; o < n->num_outputs(); ++o)
      ins.labels.push_back(InternLabel(n->op()->qualified + " -> " + n->output(o).ToString()));
    instructions_.push_back(std::move(ins));
  }

  // Liveness: free each slot right after its last reader, unless it is a program output.
  std::vector<int> last_use(num_slots_, -1);
  for (size_t i = 0; i < instructions_.size(); ++i)
    for (int s : instructions_[i].inputs) last_use[s] = static_cast<int>(i);
  for (int s : output_slots_) last_use[s] = -2;
  for (int s = 0; s < num_slots_; ++s)
    if (last_use[s] >= 0) instructions_[last_use[s]].free_after.push_back(s);
  // Outputs nobody reads (e.g. the unused second result of an op) are freed at once.
  for (auto& ins : instructions_)
    for (int s : ins.outputs)
      if (last_use[s] == -1) ins.free_after.push_back(s);

  // Zero-copy views (view_aliasing.h). A strided (permuted) result must stay inside the
  // program and reach only kernels that accept any strides.
  std::vector<bool> strided_ok(num_slots_, true);
  for (int s : output_slots_) strided_ok[s] = false;
  for (auto& ins : instructions_) {
    bool internal = ins.node->op()->internal;
    ins.contiguous_inputs = IsStrideSensitive(ins.node->op());
    if (internal || ins.contiguous_inputs)
      for (int s : ins.inputs) strided_ok[s] = false;
  }
  for (auto& ins : instructions_) {
    if (ins.node->op()->internal || !ins.mutable_inputs.empty()) continue;
    ins.alias = ViewAliasOf(*ins.node);
    if (ins.alias == ViewAlias::kPermute && !strided_ok[ins.outputs[0]])
      ins.alias = ViewAlias::kNone;
  }
}

bool Executable::TryAliasInput(const Instruction& ins, std::vector<SlotValue>& slots) const {
  int in = ins.inputs[0];
  if (std::find(ins.free_after.begin(), ins.free_after.end(), in) == ins.free_after.end())
    return false;  // read again later: keep it, copy
  SlotValue& input = slots[in];
  for (const BufferPtr& b : input) {
    if (!b) return false;
    // Nobody outside this slot may hold the buffer (a live tensor, another slot). Devices of a
    // replicated value share one allocation block, so count this slot's own references to it.
    long own = 0;
    for (const BufferPtr& other : input) own += !b.owner_before(other) && !other.owner_before(b);
    if (b.use_count() != own) return false;
    if (ins.alias == ViewAlias::kReinterpret && !b->tensor.is_contiguous()) return false;
  }
  SlotValue result(input.size());
  std::map<const void*, at::Tensor> views;  // devices sharing a host tensor share its view
  for (size_t d = 0; d < input.size(); ++d) {
    const at::Tensor& t = input[d]->tensor;
    auto it = views.find(t.unsafeGetTensorImpl());
    if (it == views.end())
      it = views.emplace(t.unsafeGetTensorImpl(), AliasedView(*ins.node, ins.alias, t)).first;
    auto buf = std::make_shared<DeviceBuffer>();
    buf->tensor = it->second;
    buf->alloc = std::move(input[d]->alloc);  // the bytes move with the data: counted once
    result[d] = std::move(buf);
  }
  slots[ins.outputs[0]] = std::move(result);
  Count("AliasedViews");
  return true;
}

void Executable::RunAtenOp(const Instruction& ins, std::vector<SlotValue>& slots,
                           const std::vector<ir::ScalarValue>& scalars,
                           std::vector<float>& seconds) const {
  if (ins.alias != ViewAlias::kNone && TryAliasInput(ins, slots)) return;
  const ir::Node& node = *ins.node;
  const c10::OperatorHandle& kernel = KernelFor(node.op());
  size_t num_devices = DeviceSet::Get().num_devices();
  std::vector<const PerDevice*> inputs;
  inputs.reserve(ins.inputs.size());
  for (int s : ins.inputs) inputs.push_back(&slots[s]);

  // Devices whose inputs are the very same host tensors compute the same result: run the
  // kernel once per distinct input set (a replicated op runs once, not once per device).
  // Devices whose inputs are the very same host tensors compute the same result: run the
  // kernel once per distinct input set (a replicated op runs once, not once per device). A
  // random op must also draw different values for different tiles of its result, so its
  // devices are told apart by the tile they hold as well, and each tile reseeds differently.
  bool random = ins.default_generator_seed >= 0;
  for (const auto& sa : ins.scalar_args) random |= sa.generator;
  const Sharding* layout =
      random && !node.shardings().empty() && node.shardings()[0].valid() ? &node.shardings()[0] : nullptr;
  auto tile_of = [&](size_t d) {
    int64_t tile = 0;
    for (int64_t dim = 0; layout && dim < layout->rank(); ++dim)
      tile = tile * layout->NumTiles(dim) + layout->TileIndex(dim, d);
    return tile;
  };
  std::vector<std::vector<size_t>> groups;
  if (!layout && (inputs.empty() || SameAcrossDevices(inputs, num_devices))) {
    groups.emplace_back();
    for (size_t d = 0; d < num_devices; ++d) groups.back().push_back(d);
  } else {
    std::map<std::vector<const void*>, size_t> group_of;
    for (size_t d = 0; d < num_devices; ++d) {
      std::vector<const void*> key;
      for (const PerDevice* in : inputs) key.push_back((*in)[d]->tensor.unsafeGetTensorImpl());
      key.push_back(reinterpret_cast<const void*>(tile_of(d)));
      auto it = group_of.emplace(key, groups.size()).first;
      if (it->second == groups.size()) groups.emplace_back();
      groups[it->second].push_back(d);
    }
  }

  std::vector<SlotValue> results(ins.outputs.size(), SlotValue(num_devices));
  for (const auto& group : groups) {
    const auto started = std::chrono::steady_clock::now();
    size_t dev = group[0];
    std::vector<c10::IValue> stack = ins.stack;
    std::vector<at::Tensor> written;  // the private copies of written inputs, in argument order
    for (const auto& [pos, input] : ins.tensor_args) {
      at::Tensor t = (*inputs[input])[dev]->tensor;
      if (ins.contiguous_inputs) t = t.contiguous();  // it reads strides (view_aliasing.h)
      for (int m : ins.mutable_inputs) {
        if (m != input) continue;
        t = t.clone();  // values are immutable: never write a live buffer
        written.push_back(t);
      }
      stack[pos] = c10::IValue(std::move(t));
    }
    for (const auto& la : ins.list_args) {
      if (la.optional) {
        c10::List<c10::optional<at::Tensor>> list;
        for (int64_t i : la.inputs)
          list.push_back(i < 0 ? c10::optional<at::Tensor>() : (*inputs[i])[dev]->tensor);
        stack[la.position] = c10::IValue(list);
      } else {
        c10::List<at::Tensor> list;
        for (int64_t i : la.inputs) list.push_back((*inputs[i])[dev]->tensor);
        stack[la.position] = c10::IValue(list);
      }
    }
    for (const auto& sa : ins.scalar_args) {
      if (sa.generator) {
        // The seed the recorder drew for this random op: same values on every run.
        stack[sa.position] = c10::IValue(at::make_generator<at::CPUGeneratorImpl>(
            static_cast<uint64_t>(scalars.at(sa.scalar_index).i) + TileSeedOffset(tile_of(dev))));
        continue;
      }
      c10::Scalar s = ToScalar(scalars.at(sa.scalar_index));
      stack[sa.position] = sa.wrapped ? c10::IValue(WrappedNumber(s)) : c10::IValue(s);
    }
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
                             TileSeedOffset(tile_of(dev)));
      }
      auto restore = [&] {
        std::lock_guard<std::mutex> lock(gen.mutex());
        gen.set_state(saved);
      };
      try {
        kernel.callBoxed(&stack);
      } catch (...) {
        restore();
        throw;
      }
      restore();
    } else {
      kernel.callBoxed(&stack);
    }
    // Flatten the returns (a Tensor[] return contributes all its elements).
    std::vector<at::Tensor> outs;
    for (c10::IValue& r : stack) {
      if (r.isTensor()) outs.push_back(r.toTensor());
      else if (r.isNone()) outs.emplace_back();  // an optional return left empty
      else if (r.isTensorList())
        for (const at::Tensor& t : r.toTensorList()) outs.push_back(t);
    }
    // Written inputs that no return carries (native_batch_norm's running stats) are extra
    // outputs, in argument order (the recorder gave the node one output per such argument).
    for (const at::Tensor& w : written) {
      bool returned = false;
      for (const at::Tensor& o : outs) returned |= o.defined() && o.is_same(w);
      if (!returned) outs.push_back(w);
    }
    SPMD_CHECK(outs.size() == ins.outputs.size(), node.op()->qualified, " returned ",
               outs.size(), " tensors but ", ins.outputs.size(), " were expected");
    for (size_t o = 0; o < outs.size(); ++o) {
      const TensorType& want = node.output(o);
      if (want.dtype == DType::kUndefined) {
        // An output the recorder knew would be undefined (convolution_backward and
        // native_layer_norm_backward with an output_mask entry false): nothing to keep.
        SPMD_CHECK(!outs[o].defined() || outs[o].numel() == 0, "internal error: ",
                   node.op()->qualified, " produced output ", o,
                   " where the program expects none");
        continue;
      }
      SPMD_CHECK(outs[o].defined(), "internal error: ", node.op()->qualified,
                 " produced no output ", o, " where the program expects ", want.ToString());
      c10::IntArrayRef got = outs[o].sizes();
      SPMD_CHECK(std::equal(got.begin(), got.end(), want.shape.begin(), want.shape.end()) &&
                     FromScalarType(outs[o].scalar_type()) == want.dtype,
                 "internal error: ", node.op()->qualified, " produced ",
                 TypeOf(outs[o]).ToString(), " where the program expects ", want.ToString());
      MakeSharedBuffers(group, outs[o], ins.labels[o], results[o]);
    }
    const float took =
        std::chrono::duration<float>(std::chrono::steady_clock::now() - started).count();
    for (size_t d : group) seconds[d] = took;
  }
  for (size_t o = 0; o < ins.outputs.size(); ++o) slots[ins.outputs[o]] = std::move(results[o]);
}

void Executable::RunInternalOp(const Instruction& ins, std::vector<SlotValue>& slots) const {
  const ir::Node& node = *ins.node;
  const InternalKernel* kernel = FindInternalKernel(node.op()->qualified);
  SPMD_CHECK(kernel != nullptr, "no runtime kernel for ", node.op()->qualified);
  std::vector<const PerDevice*> inputs;
  for (int s : ins.inputs) inputs.push_back(&slots[s]);
  std::vector<PerDevice> outs = (*kernel)(node, inputs);
  SPMD_CHECK(outs.size() == ins.outputs.size(), node.op()->qualified, " produced ", outs.size(),
             " outputs, expected ", ins.outputs.size());
  for (size_t o = 0; o < outs.size(); ++o) slots[ins.outputs[o]] = std::move(outs[o]);
}

std::vector<DeviceDataPtr> Executable::Run(const std::vector<DeviceDataPtr>& params,
                                           const std::vector<ir::ScalarValue>& scalars,
                                           const std::vector<bool>& donated) const {
  SPMD_CHECK(params.size() == param_slots_.size(), "program expects ", param_slots_.size(),
             " parameters, got ", params.size());
  SPMD_CHECK(donated.empty() || donated.size() == params.size(), "program expects ",
             params.size(), " donation flags, got ", donated.size());
  // Slots own their buffers; everything still allocated is released if a kernel throws.
  std::vector<SlotValue> slots(num_slots_);
  std::vector<bool> donated_slot(num_slots_, false);
  for (size_t i = 0; i < params.size(); ++i) {
    slots[param_slots_[i]] = params[i]->shards();
    if (!donated.empty() && donated[i]) donated_slot[param_slots_[i]] = true;
  }
  // Donated inputs whose device memory was given back; taken back if the run fails.
  std::vector<BufferPtr> given_back;
  RunProfile profile;
  profile.program = &program_;
  profile.seconds.reserve(instructions_.size());
  const size_t num_devices = DeviceSet::Get().num_devices();
  try {
    for (const Instruction& ins : instructions_) {
      profile.node_index.push_back(ins.node_index);
      profile.seconds.emplace_back(num_devices, 0.0f);
      std::vector<float>& seconds = profile.seconds.back();
      try {
        if (ins.node->op()->internal) {
          const auto started = std::chrono::steady_clock::now();
          RunInternalOp(ins, slots);  // all devices at once: each gets the whole time
          std::fill(seconds.begin(), seconds.end(),
                    std::chrono::duration<float>(std::chrono::steady_clock::now() - started).count());
        } else {
          RunAtenOp(ins, slots, scalars, seconds);
        }
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
      for (int s : ins.free_after) {
        if (donated_slot[s])
          for (const BufferPtr& b : slots[s])
            if (b && b->alloc.active()) {
              b->alloc.Release();
              given_back.push_back(b);
            }
        SlotValue().swap(slots[s]);
      }
    }
  } catch (...) {
    // The step failed: the donated inputs are still needed (their tensors' pending values
    // depend on them). Their host data never left; account their bytes again.
    slots.clear();
    for (const BufferPtr& b : given_back)
      b->alloc = DeviceSet::Get().Allocate(b->alloc.device(), b->tensor.numel() *
                                                                  static_cast<int64_t>(b->tensor.element_size()),
                                           "input restored after a failed step");
    throw;
  }
  std::vector<DeviceDataPtr> outputs;
  outputs.reserve(output_slots_.size());
  for (size_t i = 0; i < output_slots_.size(); ++i) {
    outputs.push_back(std::make_shared<DeviceData>(program_.output_global_types[i],
                                                   program_.output_shardings[i],
                                                   slots[output_slots_[i]]));
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
