// An op's arguments as the recorder needs them, in one pass: the IR node's inputs and args, the
// meta-tensor argument list for shape inference, and the signature its shape cache is keyed by.
#pragma once
#include <ATen/core/dispatch/Dispatcher.h>

#include <vector>

#include "aten/lazy_tensor.h"
#include "aten/op_plan.h"
#include "ir/node.h"

namespace spmd::aten {

// A random op's seed, drawn now from `gen` (arg_converter.cc says how seeds are used).
ir::Arg DrawSeed(at::Generator gen);

class ArgConverter {
 public:
  ArgConverter(const OpPlan& plan, c10::ArrayRef<c10::IValue> args);

  std::vector<ir::Value> inputs;  // the node's inputs (an argument's Arg::Tensor indexes them)
  bool any_lazy = false;          // an argument is an spmd tensor
  bool unsupported = false;       // an argument cannot be recorded: the op runs eagerly

  std::vector<ir::Arg>& args() { return args_; }
  // The arguments with every spmd tensor replaced by a meta tensor of its type, for shape
  // inference. Built on first use: a shape-cache hit never needs it.
  std::vector<c10::IValue>& meta();
  // Argument `arg`'s spmd tensor, or null.
  LazyImpl* impl(size_t arg) const { return impls_[arg]; }
  uint64_t signature() const { return signature_; }

 private:
  void Mix(uint64_t h);
  void Convert(size_t i, const c10::IValue& v);
  ir::Arg ConvertTensorList(const c10::IValue& v, c10::IValue* meta);
  ir::Arg ConvertOptionalTensorList(const c10::IValue& v, c10::IValue* meta);
  ir::Arg ConvertScalar(const c10::IValue& v);
  ir::Arg ConvertScalarList(const c10::IValue& v);
  ir::Arg ConvertPlain(ir::ArgType type, const c10::IValue& v);
  ir::Arg ConvertTensor(const at::Tensor& t, c10::IValue* meta, LazyImpl** impl_out,
                        bool host_ok = false);
  ir::Arg AddInput(const ir::Value& v);

  bool deferred_meta_ = false;
  bool reads_tensor_ = false;    // a tensor argument the op does not write
  uint64_t scalar_values_ = 0;   // of its Scalar arguments
  const OpPlan& plan_;
  std::vector<ir::Arg> args_;
  std::vector<c10::IValue> meta_;
  std::vector<LazyImpl*> impls_;
  uint64_t signature_ = 0;
};

}  // namespace spmd::aten
