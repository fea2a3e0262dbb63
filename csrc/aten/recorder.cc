#include "aten/recorder.h"

#include "aten/backend.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/FunctionalTensorWrapper.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <functional>
#include <numeric>
#include <thread>
#include <sstream>

#include "aten/arg_converter.h"
#include "aten/eager_fallback.h"
#include "aten/graph_template.h"
#include "aten/host_bookkeeping.h"
#include "aten/lazy_tensor.h"
#include "aten/named_ops.h"
#include "aten/sync.h"
#include "aten/view_layout.h"
#include "core/error.h"
#include "core/metrics.h"
#include "runtime/device_data.h"
#include "runtime/error_message.h"

namespace spmd::aten {

namespace {

using ir::Arg;

struct ShapeResult {
  std::vector<TensorType> types;
  std::vector<int> counts;  // outputs per return (a Tensor[] return has several)
};

ShapeResult ShapesFromMetaReturns(const torch::jit::Stack& stack) {
  ShapeResult r;
  auto type_of = [](const at::Tensor& t) {
    return t.defined() ? runtime::TypeOf(t) : TensorType{DType::kUndefined, {}};
  };
  for (const c10::IValue& v : stack) {
    if (v.isTensorList()) {
      auto list = v.toTensorList();
      for (at::Tensor t : list) r.types.push_back(type_of(t));
      r.counts.push_back(static_cast<int>(list.size()));
    } else {
      r.types.push_back(v.isTensor() ? type_of(v.toTensor()) : TensorType{DType::kUndefined, {}});
      r.counts.push_back(1);
    }
  }
  return r;
}

std::string DescribeInputs(const OpPlan& plan, c10::ArrayRef<c10::IValue> args) {
  std::ostringstream os;
  os << "(";
  bool first = true;
  for (size_t i = 0; i < args.size(); ++i) {
    const c10::IValue& v = args[i];
    if (!v.isTensor()) continue;
    os << (first ? "" : ", ") << plan.info->args[i].name << "=";
    first = false;
    const at::Tensor& t = v.toTensor();
    if (!t.defined()) { os << "None"; continue; }
    os << runtime::TypeOf(t).ToString();
  }
  return os.str() + ")";
}

}  // namespace

void RecordReshapeAliasAsView(OpPlan& plan, torch::jit::Stack* stack) {
  if (!plan.recorded_as)  // (GraphMutex, held by LazyFallback, guards the plan)
    plan.recorded_as = &GetOpPlan(c10::Dispatcher::singleton().findSchemaOrThrow(
        FindNamedOp(plan.info->qualified)->recorded_as, ""));
  torch::jit::drop(*stack, 1);  // stride
  RecordOp(*plan.recorded_as, stack);
}

at::Tensor WrapOutput(const ir::Value& v, bool factory) {
  bool excluded =
      c10::impl::tls_local_dispatch_key_set().excluded_.has(c10::DispatchKey::Functionalize);
  return factory && !excluded ? MakeFunctionalLazyTensor(v) : MakeLazyTensor(v);
}

ir::Value UploadValue(const at::Tensor& host) {
  return ir::Value{ir::MakeDataNode(runtime::DeviceData::HeldOnHost(host)), 0};
}

ir::Value RecordNode(const ir::OpInfo* op, std::vector<ir::Value> inputs,
                     std::vector<ir::Arg> args, TensorType output) {
  return ir::Value{ir::MakeNode(op, std::move(inputs), std::move(args), {std::move(output)}), 0};
}

namespace {
const std::thread::id g_import_thread = std::this_thread::get_id();  // Python's main thread
std::atomic<bool> g_recorded_off_main{false};
}  // namespace

bool RecordedOffMainThread() { return g_recorded_off_main.load(std::memory_order_relaxed); }

void LazyFallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  RegisterPendingCustomOps();  // custom ops a library registered since (custom_ops.cc)
  // torch's autograd runs device backward on a worker thread (see
  // torch_spmd/_torch_patches/autograd_exit.py).
  if (std::this_thread::get_id() != g_import_thread)
    g_recorded_off_main.store(true, std::memory_order_relaxed);
  std::lock_guard<GraphLock> lock(GraphMutex());
  OpPlan& plan = GetOpPlan(op);
  if (plan.special) return plan.special(plan, stack);
  if (plan.eager_only) return RunEager(plan, stack);
  RecordOp(plan, stack);
}

namespace {

// The op's output types: from the plan's cache of argument signatures, else its meta kernel
// (or custom shape function). False when no meta path fits these arguments and the op ran
// eagerly instead (the stack then holds its results).
bool InferShapes(OpPlan& plan, ArgConverter& conv, torch::jit::Stack* stack, ShapeResult* shapes) {
  // GraphMutex (held by LazyFallback) guards the plan's shape cache.
  auto it = plan.shape_cache.find(conv.signature());
  if (it != plan.shape_cache.end()) {
    shapes->types = it->second.types;
    shapes->counts = it->second.counts;
  } else {
    try {
      if (plan.custom_shape) {
        shapes->types = plan.custom_shape(*plan.handle, conv.meta());
      } else {
        torch::jit::Stack meta_stack = conv.meta();
        plan.handle->callBoxed(&meta_stack);
        *shapes = ShapesFromMetaReturns(meta_stack);
      }
    } catch (const std::exception& meta_error) {
      ClearPendingPythonError(meta_error);
      // No usable meta path for these arguments. Run the op eagerly: if the host kernel
      // accepts them the meta kernel was merely missing; if it rejects them too, the inputs
      // are wrong and the user gets the op, its input shapes and the kernel's reason.
      std::string inputs = DescribeInputs(plan, conv.meta());
      try {
        RunEager(plan, stack);
        return false;
      } catch (const std::exception& e) {
        TORCH_CHECK(false, plan.info->qualified, ": cannot infer the output shapes for inputs ",
                    inputs, ": ", runtime::UserMessage(e));
      }
    }
    if (plan.shape_cache.size() >= OpPlan::kMaxCachedShapes) plan.shape_cache.clear();
    plan.shape_cache.emplace(conv.signature(), OpPlan::CachedShapes{shapes->types, shapes->counts});
  }
  if (shapes->counts.empty()) shapes->counts.assign(shapes->types.size(), 1);
  if (shapes->counts.size() != plan.returns.size()) {
    // A list return whose length only the meta kernel knows: recompute it.
    torch::jit::Stack meta_stack = conv.meta();
    plan.handle->callBoxed(&meta_stack);
    *shapes = ShapesFromMetaReturns(meta_stack);
  }
  return true;
}

// Written arguments no return covers: extra outputs after the returns (the runtime appends
// the written copies of those inputs; see Executable::RunAtenOp). (argument, output index).
std::vector<std::pair<int, int>> AppendWrittenOutputs(const OpPlan& plan, ArgConverter& conv,
                                                      ShapeResult& shapes) {
  std::vector<std::pair<int, int>> written;
  for (int arg : plan.written_args) {
    if (conv.args()[arg].kind != ir::Arg::Kind::kTensor) continue;  // None
    written.emplace_back(arg, static_cast<int>(shapes.types.size()));
    shapes.types.push_back(conv.inputs[conv.args()[arg].i].type());
  }
  return written;
}

// A view's output layouts, found before the node takes the arguments (GraphMutex, held by
// LazyFallback, guards the plan's cache); null for other ops.
const std::vector<OpPlan::ViewLayout>* ViewLayoutsOf(OpPlan& plan, ArgConverter& conv) {
  if (!plan.view_op || !conv.impl(0)) return nullptr;
  return &ViewLayoutsFor(plan, conv.signature(), conv.impl(0), conv.meta());
}

// Pushes the op's returns onto the stack: new lazy tensors of its results, or for in-place and
// out= returns the argument that takes the value. Returns the outputs that get a view layout.
std::vector<at::Tensor> PushReturns(const OpPlan& plan, ArgConverter& conv,
                                    const ShapeResult& shapes,
                                    const std::function<ir::Value(int)>& result, bool factory,
                                    const std::vector<c10::IValue>& original_args,
                                    torch::jit::Stack* stack) {
  std::vector<at::Tensor> view_outputs;
  int out = 0;
  for (size_t r = 0; r < plan.returns.size(); ++r) {
    if (plan.returns[r] == ReturnKind::kTensorList) {
      c10::List<at::Tensor> list;
      for (int k = 0; k < shapes.counts[r]; ++k, ++out) {
        list.push_back(WrapOutput(result(out), factory));
        if (plan.view_op) view_outputs.push_back(list.get(list.size() - 1));
      }
      stack->push_back(list);
      continue;
    }
    ir::Value v = result(out++);
    int alias = plan.return_alias[r];
    if (v.type().dtype == DType::kUndefined) {
      stack->push_back(c10::IValue(at::Tensor()));
    } else if (alias >= 0 && conv.impl(alias)) {
      SetSlotValue(conv.impl(alias)->slot(), v);  // in-place / out=: the argument takes the value
      stack->push_back(original_args[alias]);
    } else {
      at::Tensor t = WrapOutput(v, factory);
      if (plan.view_op) view_outputs.push_back(t);
      stack->push_back(std::move(t));
    }
  }
  return view_outputs;
}

}  // namespace

// Records one op: its arguments converted, its output types inferred, a node made (or its
// shape bookkeeping run on the host), lazy tensors of its results pushed.
void RecordOp(OpPlan& plan, torch::jit::Stack* stack) {
  size_t num_args = plan.info->args.size();
  auto args = torch::jit::last(*stack, num_args);
  ArgConverter conv(plan, args);
  if (conv.unsupported) return RunEager(plan, stack);
  ShapeResult shapes;
  if (!InferShapes(plan, conv, stack, &shapes)) return;  // it ran eagerly
  const std::vector<std::pair<int, int>> written = AppendWrittenOutputs(plan, conv, shapes);
  if (plan.reseed_default_generator)
    conv.args().push_back(DrawSeed(at::detail::getDefaultCPUGenerator()));
  const std::vector<OpPlan::ViewLayout>* view_layouts = ViewLayoutsOf(plan, conv);
  ir::NodePtr node = ir::MakeNode(plan.info, std::move(conv.inputs), std::move(conv.args()),
                                  shapes.types);
  // Shape bookkeeping of token ids and masks runs on the host (host_bookkeeping.h). The node is
  // dropped first: syncing a pending operand must not see it as a later reader.
  std::vector<ir::Value> on_host;
  if (RunsOnHost(plan, *node)) {
    node.reset();
    on_host = ComputeOnHost(plan, args);
    SPMD_CHECK(static_cast<int64_t>(on_host.size()) ==
                   std::accumulate(shapes.counts.begin(), shapes.counts.end(), int64_t{0}),
               plan.info->qualified, " on the host gave ", on_host.size(), " results");
  }
  auto result = [&](int index) { return on_host.empty() ? ir::Value{node, index} : on_host[index]; };
  // In-place and out= ops return the argument they wrote: keep those before the stack drops.
  std::vector<c10::IValue> original_args;
  if (std::any_of(plan.return_alias.begin(), plan.return_alias.end(), [](int a) { return a >= 0; }))
    original_args.assign(args.begin(), args.end());
  torch::jit::drop(*stack, num_args);
  std::vector<at::Tensor> view_outputs =
      PushReturns(plan, conv, shapes, result, /*factory=*/!conv.any_lazy, original_args, stack);
  if (view_layouts) ApplyViewLayout(*view_layouts, view_outputs);
  for (const auto& [arg, index] : written) {
    if (LazyImpl* impl = conv.impl(arg)) SetSlotValue(impl->slot(), ir::Value{node, index});
  }
}

}  // namespace spmd::aten
