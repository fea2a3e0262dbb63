// Ops the recorder does not record: run on the host values of their arguments (the eager
// fallback), or answered from tensor metadata alone.
#pragma once
#include <ATen/core/dispatch/Dispatcher.h>

#include <exception>
#include <vector>

#include "aten/lazy_tensor.h"
#include "aten/op_plan.h"

namespace spmd::aten {

// Runs `op` on the host values of its arguments and uploads tensor results (replicated).
void RunEager(OpPlan& plan, torch::jit::Stack* stack);
// `args` with every spmd tensor replaced by its host value (pending ones are synced first) and
// device arguments by the CPU: the argument stack of the op's CPU kernel. Written tensors are
// private copies. Fills `impls` (per argument, its spmd tensor, else null) and `any_lazy`
// when given.
std::vector<c10::IValue> HostArguments(const OpPlan& plan, c10::ArrayRef<c10::IValue> args,
                                       std::vector<LazyImpl*>* impls, bool* any_lazy);

// Answers an op that reads only tensor metadata (is_same_size, ...) on meta tensors, without
// materializing anything.
void AnswerFromMetadata(OpPlan& plan, torch::jit::Stack* stack);

// After handling an exception from a kernel written in Python (torch's python_error), clears
// the Python error indicator it left set. No-op for C++ (c10) errors.
void ClearPendingPythonError(const std::exception& e);

}  // namespace spmd::aten
