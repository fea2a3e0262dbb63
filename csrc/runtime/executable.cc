#include "runtime/executable.h"

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <set>
#include <unordered_map>

#include "core/error.h"
#include "ir/internal_ops.h"
#include "runtime/internal_kernels.h"

namespace spmd::runtime {

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

bool SameAcrossDevices(const std::vector<const PerDevice*>& inputs, size_t num_devices) {
  for (const PerDevice* in : inputs)
    for (size_t d = 1; d < num_devices; ++d)
      if ((*in)[d]->tensor.unsafeGetTensorImpl() != (*in)[0]->tensor.unsafeGetTensorImpl())
        return false;
  return true;
}

// Ops that draw random numbers. Devices holding the same tile of their result (replicas over
// the axes that do not tile it) must draw the same numbers, or the "replicated" value differs
// between devices; devices holding different tiles draw independently.
bool IsRandomOp(const ir::OpInfo& op) {
  static const std::set<std::string> names = {
      "aten::bernoulli", "aten::bernoulli_", "aten::native_dropout", "aten::rand",
      "aten::rand_like", "aten::randn", "aten::randn_like", "aten::randint",
      "aten::randint_like", "aten::randperm", "aten::normal", "aten::normal_",
      "aten::uniform_", "aten::random_", "aten::exponential_", "aten::geometric_",
      "aten::cauchy_", "aten::log_normal_", "aten::multinomial", "aten::poisson",
      "aten::rrelu_with_noise", "aten::_fused_dropout", "aten::_standard_gamma"};
  if (names.count(op.name)) return true;
  for (const ir::ArgSchema& a : op.args)
    if (a.type == ir::ArgType::kGenerator) return true;
  return false;
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
    for (const ir::Value& v : n->inputs()) ins.inputs.push_back(slot_of(v));
    for (int o = 0; o < n->num_outputs(); ++o) ins.outputs.push_back(first_slot.at(n.get()) + o);
    if (!n->op()->internal) {
      KernelFor(n->op());  // resolve the kernel now, so a missing op fails at compile time
      const auto& schema_args = n->op()->args;
      for (size_t a = 0; a < n->args().size(); ++a) {
        const ir::Arg& arg = n->args()[a];
        int pos = static_cast<int>(a);
        using K = ir::Arg::Kind;
        if (arg.kind == K::kTensor) {
          ins.tensor_args.emplace_back(pos, static_cast<int>(arg.i));
          if (a < schema_args.size() && schema_args[a].is_write)
            ins.mutable_inputs.push_back(static_cast<int>(arg.i));
        } else if (arg.kind == K::kTensorList || arg.kind == K::kOptTensorList) {
          ins.list_args.push_back({pos, arg.ints, arg.kind == K::kOptTensorList});
        } else if (arg.dynamic) {
          SPMD_CHECK(arg.slot >= 0, "internal error: run-time scalar without a slot in ",
                     n->op()->qualified);
          ins.scalar_args.push_back({pos, arg.slot, arg.wrapped});
        }
        ins.stack.push_back(ConstantIValue(arg));
      }
    }
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
}

void Executable::RunAtenOp(const Instruction& ins, std::vector<SlotValue>& slots,
                           const std::vector<ir::ScalarValue>& scalars) const {
  const ir::Node& node = *ins.node;
  const c10::OperatorHandle& kernel = KernelFor(node.op());
  size_t num_devices = DeviceSet::Get().num_devices();
  std::vector<const PerDevice*> inputs;
  inputs.reserve(ins.inputs.size());
  for (int s : ins.inputs) inputs.push_back(&slots[s]);

  // Devices whose inputs are the very same host tensors compute the same result: run the
  // kernel once per distinct input set (a replicated op runs once, not once per device).
  std::vector<std::vector<size_t>> groups;
  const bool random = IsRandomOp(*node.op()) && !node.shardings().empty() &&
                      node.shardings()[0].valid();
  if (random) {
    // One draw per tile of the result, shared by the devices holding that tile.
    const Sharding& layout = node.shardings()[0];
    std::map<std::vector<int64_t>, size_t> group_of;
    for (size_t d = 0; d < num_devices; ++d) {
      std::vector<int64_t> tile;
      for (int64_t dim = 0; dim < layout.rank(); ++dim)
        tile.push_back(layout.TileIndex(dim, static_cast<int64_t>(d)));
      auto it = group_of.emplace(tile, groups.size()).first;
      if (it->second == groups.size()) groups.emplace_back();
      groups[it->second].push_back(d);
    }
  } else if (inputs.empty() || SameAcrossDevices(inputs, num_devices)) {
    groups.emplace_back();
    for (size_t d = 0; d < num_devices; ++d) groups.back().push_back(d);
  } else {
    std::map<std::vector<const void*>, size_t> group_of;
    for (size_t d = 0; d < num_devices; ++d) {
      std::vector<const void*> key;
      for (const PerDevice* in : inputs) key.push_back((*in)[d]->tensor.unsafeGetTensorImpl());
      auto it = group_of.emplace(key, groups.size()).first;
      if (it->second == groups.size()) groups.emplace_back();
      groups[it->second].push_back(d);
    }
  }

  std::vector<SlotValue> results(ins.outputs.size(), SlotValue(num_devices));
  std::string label;
  for (const auto& group : groups) {
    size_t dev = group[0];
    std::vector<c10::IValue> stack = ins.stack;
    for (const auto& [pos, input] : ins.tensor_args) {
      at::Tensor t = (*inputs[input])[dev]->tensor;
      for (int m : ins.mutable_inputs)
        if (m == input) t = t.clone();  // values are immutable: never write a live buffer
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
      c10::Scalar s = ToScalar(scalars.at(sa.scalar_index));
      stack[sa.position] = sa.wrapped ? c10::IValue(WrappedNumber(s)) : c10::IValue(s);
    }
    kernel.callBoxed(&stack);
    // Flatten the returns (a Tensor[] return contributes all its elements).
    std::vector<at::Tensor> outs;
    for (c10::IValue& r : stack) {
      if (r.isTensor()) outs.push_back(r.toTensor());
      else if (r.isTensorList())
        for (const at::Tensor& t : r.toTensorList()) outs.push_back(t);
    }
    SPMD_CHECK(outs.size() == ins.outputs.size(), node.op()->qualified, " returned ",
               outs.size(), " tensors but ", ins.outputs.size(), " were expected");
    for (size_t o = 0; o < outs.size(); ++o) {
      // Buffers are always contiguous, as the lazy tensors' strides say: the program passes
      // explicit strides computed for that layout (_reshape_alias_copy, as_strided_copy,
      // as_strided_scatter), and transpose_copy/permute_copy/t_copy/diagonal_copy return
      // strided results that those would misread.
      if (outs[o].defined() && !outs[o].is_contiguous()) outs[o] = outs[o].contiguous();
      const TensorType& want = node.output(o);
      // A result the op was asked not to compute (output_mask false: layer/batch norm
      // backward without weight) comes back undefined.
      bool undefined_ok = want.dtype == DType::kUndefined && !outs[o].defined();
      SPMD_CHECK(undefined_ok || (outs[o].sizes().vec() == want.shape &&
                                  FromScalarType(outs[o].scalar_type()) == want.dtype),
                 "internal error: ", node.op()->qualified, " produced ",
                 TypeOf(outs[o]).ToString(), " where the program expects ", want.ToString());
      if (label.empty()) label = node.op()->qualified + " -> " + want.ToString();
      for (size_t d : group) results[o][d] = MakeBuffer(d, outs[o], label);
    }
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
                                           const std::vector<ir::ScalarValue>& scalars) const {
  SPMD_CHECK(params.size() == param_slots_.size(), "program expects ", param_slots_.size(),
             " parameters, got ", params.size());
  // Slots own their buffers; everything still allocated is released if a kernel throws.
  std::vector<SlotValue> slots(num_slots_);
  for (size_t i = 0; i < params.size(); ++i) slots[param_slots_[i]] = params[i]->shards();
  for (const Instruction& ins : instructions_) {
    if (ins.node->op()->internal) RunInternalOp(ins, slots);
    else RunAtenOp(ins, slots, scalars);
    for (int s : ins.free_after) SlotValue().swap(slots[s]);
  }
  std::vector<DeviceDataPtr> outputs;
  outputs.reserve(output_slots_.size());
  for (size_t i = 0; i < output_slots_.size(); ++i) {
    outputs.push_back(std::make_shared<DeviceData>(program_.output_global_types[i],
                                                   program_.output_shardings[i],
                                                   slots[output_slots_[i]]));
  }
  return outputs;
}

}  // namespace spmd::runtime
