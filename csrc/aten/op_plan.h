// What the recorder needs to know about an ATen op, computed once from its schema: the
// torch-free OpInfo for the IR, the kinds of its returns, which returns alias a written
// argument (in-place and out= ops), and how its output shapes are found.
#pragma once
#include <ATen/core/dispatch/Dispatcher.h>

#include <mutex>
#include <optional>
#include <unordered_map>
#include <vector>

#include "core/shape.h"
#include "ir/op.h"

namespace spmd::aten {

enum class ReturnKind : uint8_t { kTensor, kTensorList, kOther };

// Output types of `op` from its arguments, with spmd tensors replaced by meta tensors.
using ShapeFn = std::vector<TensorType> (*)(const c10::OperatorHandle& op,
                                            const std::vector<c10::IValue>& meta_args);

struct OpPlan;
// A kernel for ops that move data between host and devices (copies, item, resize): they are
// not recorded as graph nodes, or only sometimes.
using SpecialKernel = void (*)(OpPlan& plan, torch::jit::Stack* stack);

struct OpPlan {
  const c10::OperatorHandle* handle = nullptr;
  const ir::OpInfo* info = nullptr;
  std::vector<ReturnKind> returns;
  std::vector<int> return_alias;  // per return: the written argument it aliases, or -1
  // Tensor arguments the op writes that no return aliases (running_mean/running_var of
  // native_batch_norm, whose schema does not even annotate them). Recorded as extra node
  // outputs after the returns; the argument's slot takes that value.
  std::vector<int> written_args;
  // A random op (tag nondeterministic_seeded) without a Generator argument (rand, randn,
  // native_dropout, ...): the recorder appends a seed after its schema arguments, and replay
  // reseeds the default CPU generator with it around the kernel (see kGenerator in recorder.cc).
  bool reseed_default_generator = false;
  SpecialKernel special = nullptr;
  bool eager_only = false;        // never recorded: run on the host (data-dependent, etc.)
  const char* eager_reason = "";
  ShapeFn custom_shape = nullptr;  // overrides the meta kernel when set
  // The plan of the op `special` records this one as (NamedOp::recorded_as), found on first use.
  OpPlan* recorded_as = nullptr;
  // For view ops and their functional *_copy twins (select_copy, t_copy, ...): the view op
  // itself, run on a meta tensor with the input's layout to find the output's strides and
  // storage offset (see view_layout.h). nullptr for other ops.
  const c10::OperatorHandle* view_op = nullptr;
  // Output types memoized by argument signature (shapes, dtypes, non-tensor values): a training
  // loop repeats its signatures, so steady-state recording never runs a meta kernel (a
  // dispatcher call, and a Python call for the meta kernels registered from Python).
  static constexpr size_t kMaxCachedShapes = 4096;
  struct CachedShapes {
    std::vector<TensorType> types;
    std::vector<int> counts;  // outputs per return
  };
  std::unordered_map<uint64_t, CachedShapes> shape_cache;
  // View layouts memoized by argument signature and the input's layout (strides, storage
  // offset): per output, its sizes, strides and storage offset; empty when the meta view op
  // gave none (the outputs keep contiguous metadata).
  struct ViewLayout {
    std::vector<int64_t> sizes, strides;
    int64_t storage_offset = 0;
  };
  std::unordered_map<uint64_t, std::vector<ViewLayout>> view_layout_cache;
};

// The plan for `op`, built on first use. Thread-safe.
OpPlan& GetOpPlan(const c10::OperatorHandle& op);

}  // namespace spmd::aten
