#include "runtime/kernel_call.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <mutex>

#include "core/error.h"

namespace spmd::runtime {

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

std::vector<at::Tensor> CallKernel(const Instruction& ins, std::vector<at::Tensor> args,
                                   const std::vector<ir::ScalarValue>& scalars, int64_t tile,
                                   bool as_view) {
  std::vector<at::Tensor> written;
  std::vector<c10::IValue> stack = FilledStack(ins, args, scalars, tile, &written);
  CallSeeded(as_view ? *ins.view_kernel : KernelFor(ins.node->op()), ins, scalars, tile, &stack);
  return KernelOutputs(ins, stack, written);
}

}  // namespace spmd::runtime
