// The boxed kernel behind every ATen op on the spmd device: records the op as one IR node
// (output shapes from the meta kernel or a shape function), or runs it eagerly on the host
// when it cannot be recorded (data-dependent shapes, non-tensor results; eager_fallback.h).
// Its parts: the arguments (arg_converter.h), the view layouts (view_layout.h).
#pragma once
#include <ATen/core/dispatch/Dispatcher.h>

#include "aten/lazy_tensor.h"
#include "aten/op_plan.h"
#include "ir/node.h"

namespace spmd::aten {

void LazyFallback(const c10::OperatorHandle& op, torch::jit::Stack* stack);

// Whether an op was recorded on a thread other than the one that imported torch_spmd (torch's
// autograd device thread, when a backward pass ran on the device).
bool RecordedOffMainThread();

// Records `op` as one IR node (the generic path of LazyFallback).
void RecordOp(OpPlan& plan, torch::jit::Stack* stack);

// Wraps a value as a new spmd tensor; factory outputs are wrapped for functionalization
// (unless functionalization is excluded in this dispatch context).
at::Tensor WrapOutput(const ir::Value& v, bool factory);

// _reshape_alias(_copy)(self, size, stride): recorded as view(_copy)(self, size). Its strides
// describe the input's virtual (strided-device) layout, while device buffers are contiguous,
// so they must not reach the kernel (XLA lowers it the same way).
void RecordReshapeAliasAsView(OpPlan& plan, torch::jit::Stack* stack);

// Records a node for an internal or ATen op built in C++ (not through the dispatcher) and
// returns its output values.
ir::Value RecordNode(const ir::OpInfo* op, std::vector<ir::Value> inputs,
                     std::vector<ir::Arg> args, TensorType output);

// A host tensor as replicated device data, held on the host until first used or annotated
// (DeviceData::HeldOnHost), as its data node's value.
ir::Value UploadValue(const at::Tensor& host);

}  // namespace spmd::aten
