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

#include "aten/graph_template.h"
#include "aten/host_bookkeeping.h"
#include "aten/lazy_tensor.h"
#include "aten/sync.h"
#include "core/error.h"
#include "core/metrics.h"
#include "runtime/device_data.h"
#include "runtime/error_message.h"

namespace spmd::aten {

// A random op draws its seed at record time, from the generator it was given (or the default
// CPU generator), and replays with a generator seeded with it (ops without a Generator argument
// get the seed as an extra trailing arg; replay reseeds the default generator around the
// kernel). So a node gives the same values every time it runs: it runs again when a later graph
// needs it (its output and a value computed from it may be synced separately; dropout's mask
// feeds the backward), and torch.manual_seed makes device randomness reproducible. The seed is a
// run-time scalar: it does not change the graph key.
ir::Arg DrawSeed(at::Generator gen) {
  ir::Arg a;
  {
    std::lock_guard<std::mutex> lock(gen.mutex());
    a.i = static_cast<int64_t>(at::check_generator<at::CPUGeneratorImpl>(gen)->random64() >> 1);
  }
  a.kind = ir::Arg::Kind::kScalarInt;
  a.dynamic = true;
  return a;
}

namespace {

using ir::Arg;

// A Scalar argument becomes a run-time input (not part of the graph key) unless it is one of
// the values that commonly select special code paths: 0, 1, and the non-finite ones (a mask's
// -inf is a constant of the model, and lowerings may rely on it, e.g. masked_fill's).
bool IsDynamicScalar(const Arg& a) {
  return a.kind == Arg::Kind::kScalarDouble && a.d != 0.0 && a.d != 1.0 && std::isfinite(a.d);
}

Arg ScalarArg(const c10::Scalar& s) {
  Arg a;
  if (s.isBoolean()) {
    a.kind = Arg::Kind::kScalarBool;
    a.i = s.toBool();
  } else if (s.isIntegral(false)) {
    a.kind = Arg::Kind::kScalarInt;
    a.i = s.toLong();
  } else {
    a.kind = Arg::Kind::kScalarDouble;
    a.d = s.toDouble();
  }
  a.dynamic = IsDynamicScalar(a);
  return a;
}

[[noreturn]] void DeviceMismatch(const at::Tensor& t) {
  TORCH_CHECK(false, "Expected all tensors to be on the same device, but found at least two "
              "devices, ", SpmdDevice().str(), " and ", t.device().str(), "!");
}

// One pass over an op's arguments: IR inputs and args, the meta-tensor argument list for
// shape inference, and a signature hash for the shape cache.
class ArgConverter {
 public:
  ArgConverter(const OpPlan& plan, c10::ArrayRef<c10::IValue> args) : plan_(plan) {
    args_.reserve(args.size());
    meta_.reserve(args.size());
    impls_.assign(args.size(), nullptr);
    for (size_t i = 0; i < args.size(); ++i) Convert(i, args[i]);
    // A Scalar's value sets the output shape only of an op that reads no tensor (arange's
    // ends); elsewhere only its kind counts (type promotion). So an optimizer's per-step
    // scalars (Adam's bias-corrected step sizes) keep hitting the shape cache.
    if (!reads_tensor_) Mix(scalar_values_);
  }

  std::vector<ir::Value> inputs;
  bool any_lazy = false;
  bool unsupported = false;

  std::vector<Arg>& args() { return args_; }
  // The arguments with every spmd tensor replaced by a meta tensor of its type, for shape
  // inference. Built on first use: a shape-cache hit never needs it.
  std::vector<c10::IValue>& meta() {
    if (deferred_meta_) {
      deferred_meta_ = false;
      for (size_t i = 0; i < meta_.size(); ++i) meta_[i] = ToMeta(meta_[i], plan_.info->args[i].type);
    }
    return meta_;
  }
  LazyImpl* impl(size_t arg) const { return impls_[arg]; }
  uint64_t signature() const { return signature_; }

 private:
  void Mix(uint64_t h) { signature_ = HashCombine(signature_, h); }

  void Convert(size_t i, const c10::IValue& v) {
    const ir::ArgSchema& schema = plan_.info->args[i];
    if (schema.type == ir::ArgType::kGenerator) {  // usually None: the default generator
      args_.push_back(DrawSeed(v.isNone() ? at::detail::getDefaultCPUGenerator()
                                         : v.toGenerator()));
      meta_.push_back(c10::IValue());
      Mix(7);
      return;
    }
    if (v.isNone()) {
      args_.push_back(Arg::None());
      meta_.push_back(v);
      Mix(1);
      return;
    }
    const bool tensor_arg = schema.type == ir::ArgType::kTensor ||
                            schema.type == ir::ArgType::kTensorList ||
                            schema.type == ir::ArgType::kOptionalTensorList;
    if (tensor_arg && !schema.is_write) reads_tensor_ = true;
    switch (schema.type) {
      case ir::ArgType::kTensor: {
        c10::IValue meta;
        args_.push_back(ConvertTensor(v.toTensor(), &meta, &impls_[i]));
        meta_.push_back(std::move(meta));
        return;
      }
      case ir::ArgType::kTensorList: {
        Arg a;
        a.kind = Arg::Kind::kTensorList;
        c10::List<at::Tensor> meta_list;
        for (at::Tensor t : v.toTensorList()) {
          c10::IValue meta;
          Arg e = ConvertTensor(t, &meta, nullptr);
          if (e.kind != Arg::Kind::kTensor) unsupported = true;  // wrapped numbers in a list
          a.ints.push_back(e.i);
          meta_list.push_back(meta.toTensor());
        }
        args_.push_back(std::move(a));
        meta_.push_back(c10::IValue(meta_list));
        return;
      }
      case ir::ArgType::kOptionalTensorList: {
        Arg a;
        a.kind = Arg::Kind::kOptTensorList;
        c10::List<c10::optional<at::Tensor>> meta_list;
        for (const c10::IValue& e : v.toListRef()) {
          // Python indexing (a[:, idx]) passes undefined tensors, not None, for the sliced
          // dims: both mean "no index here".
          if (e.isNone() || !e.toTensor().defined()) {
            a.ints.push_back(-1);
            meta_list.push_back(c10::nullopt);
            Mix(2);
            continue;
          }
          c10::IValue meta;
          // Tensor?[] is the indices of index/index_put, which may live on the host, as with
          // CUDA.
          Arg ea = ConvertTensor(e.toTensor(), &meta, nullptr, /*host_ok=*/true);
          if (ea.kind != Arg::Kind::kTensor) unsupported = true;
          a.ints.push_back(ea.i);
          meta_list.push_back(meta.toTensor());
        }
        args_.push_back(std::move(a));
        meta_.push_back(c10::IValue(meta_list));
        return;
      }
      case ir::ArgType::kScalar: {
        if (v.isComplexDouble()) unsupported = true;
        Arg a = unsupported ? Arg::None() : ScalarArg(v.toScalar());
        Mix(HashInt(static_cast<int64_t>(a.kind)));
        if (a.is_scalar())
          scalar_values_ = HashCombine(scalar_values_, HashCombine(HashInt(a.i), HashDouble(a.d)));
        args_.push_back(a);
        meta_.push_back(v);
        return;
      }
      case ir::ArgType::kScalarList: {
        // Every value is a run-time input (a list optimizer's step sizes change every step);
        // the kinds stay in the key (type promotion). An integer a double cannot hold exactly
        // is not recordable.
        Arg a;
        a.kind = Arg::Kind::kScalarList;
        a.dynamic = true;
        for (const c10::IValue& e : v.toListRef()) {
          c10::Scalar s = e.toScalar();
          if (s.isComplex()) {
            unsupported = true;
            continue;
          }
          Arg one = ScalarArg(s);
          constexpr int64_t kExact = int64_t{1} << 53;  // doubles hold integers up to 2^53
          if (one.kind == Arg::Kind::kScalarInt && (one.i > kExact || one.i < -kExact))
            unsupported = true;
          a.ints.push_back(static_cast<int64_t>(one.kind));
          a.doubles.push_back(one.kind == Arg::Kind::kScalarDouble ? one.d
                                                                  : static_cast<double>(one.i));
        }
        Mix(HashCombine(HashInt(static_cast<int64_t>(a.kind)), HashInts(a.ints)));
        args_.push_back(std::move(a));
        meta_.push_back(v);
        return;
      }
      case ir::ArgType::kDevice:
        args_.push_back(Arg{Arg::Kind::kDevice});
        meta_.push_back(c10::IValue(c10::Device(c10::kMeta)));
        Mix(4);
        return;
      default:
        args_.push_back(ConvertPlain(schema.type, v));
        meta_.push_back(v);
        Mix(args_.back().hash());
        return;
    }
  }

 private:
  Arg ConvertPlain(ir::ArgType type, const c10::IValue& v) {
    switch (type) {
      case ir::ArgType::kInt:
        return Arg::Int(v.isInt() ? v.toInt() : v.toSymInt().expect_int());
      case ir::ArgType::kIntList: {
        if (v.isIntList()) return Arg::IntList(v.toIntVector());
        std::vector<int64_t> ints;
        for (const c10::IValue& e : v.toListRef())
          ints.push_back(e.isInt() ? e.toInt() : e.toSymInt().expect_int());
        return Arg::IntList(std::move(ints));
      }
      case ir::ArgType::kFloat: return Arg::Double(v.toDouble());
      case ir::ArgType::kFloatList: {
        Arg a;
        a.kind = Arg::Kind::kDoubleList;
        a.doubles = v.toDoubleVector();
        return a;
      }
      case ir::ArgType::kBool: return Arg::Bool(v.toBool());
      case ir::ArgType::kBoolList: {
        Arg a;
        a.kind = Arg::Kind::kBoolList;
        for (bool b : v.toBoolList()) a.ints.push_back(b);
        return a;
      }
      case ir::ArgType::kString: return Arg::String(v.toStringRef());
      case ir::ArgType::kScalarType: return Arg::ScalarType(v.toInt());
      case ir::ArgType::kLayout: { Arg a = Arg::Int(v.toInt()); a.kind = Arg::Kind::kLayout; return a; }
      case ir::ArgType::kMemoryFormat: {
        Arg a = Arg::Int(v.toInt());
        a.kind = Arg::Kind::kMemoryFormat;
        return a;
      }
      default:
        unsupported = true;
        return Arg::None();
    }
  }

  Arg ConvertTensor(const at::Tensor& t, c10::IValue* meta, LazyImpl** impl_out,
                    bool host_ok = false) {
    if (!t.defined()) {
      *meta = c10::IValue();
      Mix(5);
      return Arg::None();
    }
    if (LazyImpl* impl = TryGetLazyImpl(t)) {
      if (impl_out) *impl_out = impl;
      any_lazy = true;
      const TensorType& type = impl->slot()->value.type();
      *meta = t;  // replaced by a meta tensor only if shape inference runs (see meta())
      deferred_meta_ = true;
      Mix(HashCombine(HashInt(static_cast<int64_t>(type.dtype)), HashInts(type.shape)));
      return AddInput(impl->slot()->value);
    }
    if (t.device().is_cpu() && t.dim() == 0) {
      if (t.unsafeGetTensorImpl()->is_wrapped_number() && !t.is_complex()) {
        // A Python number: replayed as a wrapped-number tensor of the current value.
        Arg a = ScalarArg(t.item());
        a.wrapped = true;
        *meta = t;
        Mix(HashCombine(HashInt(static_cast<int64_t>(t.scalar_type())), 6));
        return a;
      }
      // A 0-dim host tensor is allowed next to device tensors, as with CUDA: upload it.
      *meta = at::empty({}, t.options().device(c10::kMeta));
      Mix(HashInt(static_cast<int64_t>(t.scalar_type())));
      return AddInput(UploadValue(t));
    }
    if (host_ok && t.device().is_cpu()) {  // uploaded as a constant of this graph
      *meta = at::empty(t.sizes(), t.options().device(c10::kMeta));
      Mix(HashCombine(HashInt(static_cast<int64_t>(t.scalar_type())), HashInts(t.sizes().vec())));
      return AddInput(UploadValue(t.contiguous()));
    }
    DeviceMismatch(t);
  }

  // A value entering a graph is on the devices: data still held on the host is uploaded now,
  // as PyTorch/XLA's virtual device uploads a tensor when an op first uses it.
  Arg AddInput(const ir::Value& v) {
    if (v.node->is_data()) static_cast<const runtime::DeviceData&>(*v.node->data()).Upload();
    inputs.push_back(v);
    return Arg::Tensor(static_cast<int64_t>(inputs.size()) - 1);
  }

  static at::Tensor MetaOf(const at::Tensor& t) {
    LazyImpl* impl = t.defined() ? TryGetLazyImpl(t) : nullptr;
    if (!impl) return t;
    const TensorType& type = impl->slot()->value.type();
    return at::empty(type.shape,
                     at::TensorOptions().dtype(runtime::ToScalarType(type.dtype)).device(c10::kMeta));
  }

  // Only tensor-typed arguments are touched: the schema type, not the IValue's tag, is what
  // reliably tells an int list from a list of optional tensors (all lists once shared a tag).
  static c10::IValue ToMeta(const c10::IValue& v, ir::ArgType type) {
    if (type == ir::ArgType::kTensor && v.isTensor()) return MetaOf(v.toTensor());
    if (type == ir::ArgType::kTensorList && v.isTensorList()) {
      c10::List<at::Tensor> list;
      for (at::Tensor t : v.toTensorList()) list.push_back(MetaOf(t));
      return list;
    }
    if (type == ir::ArgType::kOptionalTensorList && v.isList()) {
      c10::List<c10::optional<at::Tensor>> list;
      for (const c10::IValue& e : v.toListRef())
        list.push_back(e.isNone() ? c10::optional<at::Tensor>() : MetaOf(e.toTensor()));
      return list;
    }
    return v;
  }

  bool deferred_meta_ = false;
  bool reads_tensor_ = false;    // a tensor argument the op does not write
  uint64_t scalar_values_ = 0;   // of its Scalar arguments
  const OpPlan& plan_;
  std::vector<Arg> args_;
  std::vector<c10::IValue> meta_;
  std::vector<LazyImpl*> impls_;
  uint64_t signature_ = 0;
};

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

// A meta tensor with the sizes, strides and storage offset of `impl`.
at::Tensor MetaWithLayout(const LazyImpl* impl) {
  auto options = at::TensorOptions().dtype(impl->dtype()).device(c10::kMeta);
  int64_t extent = impl->storage_offset() + 1;
  for (int64_t d = 0; d < impl->dim(); ++d) {
    if (impl->sizes()[d] == 0) return at::empty_strided(impl->sizes(), impl->strides(), options);
    extent += (impl->sizes()[d] - 1) * impl->strides()[d];
  }
  return at::empty({extent}, options)
      .as_strided(impl->sizes(), impl->strides(), impl->storage_offset());
}

// A view must *describe itself* as a strided device's view would, whatever the layout of the
// buffer behind it: stride(), storage_offset(), is_contiguous() and as_strided on views read
// it. A functionalization wrapper reports its inner value's sizes and strides (custom
// sizes/strides policy), so each view output gets the strides and storage offset that running
// the view op on a meta tensor with its input's layout gives (layouts compose along view
// chains). Buffers keep the layout their CPU kernel gave them; the few ops that interpret
// strides (as_strided_copy/scatter on a root, which is described as contiguous) get contiguous
// inputs at replay (executable.cc). (torch 1.13's autograd also replayed views through these
// strides; torch 2.x replays functional views with view functions instead.) The layouts are
// memoized: a training loop records the same views of the same layouts every step.

// The key of a view's layout: its arguments' signature and the input's strides and offset.
uint64_t ViewLayoutKey(uint64_t signature, const LazyImpl* in) {
  uint64_t key = HashCombine(signature, HashInt(in->storage_offset()));
  for (int64_t stride : in->strides()) key = HashCombine(key, HashInt(stride));
  return key;
}

// The layouts of a view op's outputs for `in`'s layout, found by running the view op on meta
// tensors (`meta_stack`: the op's arguments as meta tensors), and cached under `key`.
const std::vector<OpPlan::ViewLayout>& CacheViewLayouts(OpPlan& plan, uint64_t key,
                                                        const LazyImpl* in,
                                                        torch::jit::Stack meta_stack) {
  std::vector<OpPlan::ViewLayout> layouts;
  try {
    meta_stack[0] = MetaWithLayout(in);
    plan.view_op->callBoxed(&meta_stack);
    for (const c10::IValue& v : meta_stack) {
      auto add = [&](const at::Tensor& t) {
        layouts.push_back({t.sizes().vec(), t.strides().vec(), t.storage_offset()});
      };
      if (v.isTensor()) add(v.toTensor());
      else if (v.isTensorList())
        for (at::Tensor t : v.toTensorList()) add(t);
    }
  } catch (const std::exception&) {
    layouts.clear();  // no layout for these arguments: the outputs keep contiguous metadata
  }
  if (plan.view_layout_cache.size() >= OpPlan::kMaxCachedShapes) plan.view_layout_cache.clear();
  return plan.view_layout_cache.emplace(key, std::move(layouts)).first->second;
}

void ApplyViewLayout(const std::vector<OpPlan::ViewLayout>& layouts,
                     const std::vector<at::Tensor>& outputs) {
  if (layouts.size() != outputs.size()) return;
  for (size_t i = 0; i < outputs.size(); ++i) {
    auto* out = dynamic_cast<LazyImpl*>(outputs[i].unsafeGetTensorImpl());
    if (!out || out->sizes() != c10::IntArrayRef(layouts[i].sizes)) continue;
    out->set_sizes_and_strides(layouts[i].sizes, layouts[i].strides);
    out->set_storage_offset(layouts[i].storage_offset);
  }
}

// A meta kernel written in Python (torch/_meta_registrations.py) that raises leaves the Python
// error indicator set when it reaches us as a C++ exception (torch's python_error). Python
// bindings restore it when they rethrow; when we handle the failure (by running the op eagerly)
// it must be cleared, or the interpreter reports "returned a result with an exception set".
// Declared weakly: the recorder does not depend on Python being there.
extern "C" {
int Py_IsInitialized(void) __attribute__((weak));
int PyGILState_Ensure(void) __attribute__((weak));  // PyGILState_STATE is an int-sized enum
void PyGILState_Release(int) __attribute__((weak));
void PyErr_Clear(void) __attribute__((weak));
}

}  // namespace

void ClearPendingPythonError(const std::exception& e) {
  if (dynamic_cast<const c10::Error*>(&e)) return;  // a C++ kernel's error: nothing pending
  if (!Py_IsInitialized || !PyGILState_Ensure || !PyGILState_Release || !PyErr_Clear) return;
  if (!Py_IsInitialized()) return;
  int state = PyGILState_Ensure();
  PyErr_Clear();
  PyGILState_Release(state);
}

void RecordReshapeAliasAsView(OpPlan& plan, torch::jit::Stack* stack) {
  static const c10::OperatorHandle view_copy =
      c10::Dispatcher::singleton().findSchemaOrThrow("aten::view_copy", "");
  static const c10::OperatorHandle view =
      c10::Dispatcher::singleton().findSchemaOrThrow("aten::view", "");
  bool is_copy = plan.info->name == "aten::_reshape_alias_copy";
  torch::jit::drop(*stack, 1);  // stride
  RecordOp(GetOpPlan(is_copy ? view_copy : view), stack);
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

std::vector<c10::IValue> HostArguments(const OpPlan& plan, c10::ArrayRef<c10::IValue> args,
                                       std::vector<LazyImpl*>* impls, bool* any_lazy) {
  const size_t num_args = plan.info->args.size();
  std::vector<c10::IValue> host(args.begin(), args.end());
  if (impls) impls->assign(num_args, nullptr);
  if (any_lazy) *any_lazy = false;
  auto to_host = [&](const at::Tensor& t, bool written, LazyImpl** impl_out) -> at::Tensor {
    LazyImpl* impl = TryGetLazyImpl(t);
    if (!impl) return t;
    if (any_lazy) *any_lazy = true;
    if (impl_out) *impl_out = impl;
    at::Tensor h = Materialize(impl->slot())->ToHost();
    return written ? h.clone() : h;  // device buffers are immutable
  };
  for (size_t i = 0; i < num_args; ++i) {
    c10::IValue& v = host[i];
    const ir::ArgSchema& schema = plan.info->args[i];
    if (v.isTensor()) {
      v = to_host(v.toTensor(), schema.is_write, impls ? &(*impls)[i] : nullptr);
    } else if (v.isTensorList()) {
      c10::List<at::Tensor> list;
      for (at::Tensor t : v.toTensorList()) list.push_back(to_host(t, schema.is_write, nullptr));
      v = list;
    } else if (schema.type == ir::ArgType::kOptionalTensorList && v.isList()) {
      c10::List<c10::optional<at::Tensor>> list;
      for (const c10::IValue& e : v.toListRef())
        list.push_back(e.isNone() ? c10::optional<at::Tensor>()
                                  : to_host(e.toTensor(), schema.is_write, nullptr));
      v = list;
    } else if (schema.type == ir::ArgType::kDevice) {
      v = c10::IValue(c10::Device(c10::kCPU));
    }
  }
  return host;
}

void RunEager(OpPlan& plan, torch::jit::Stack* stack) {
  NoteHostWork();
  Count("EagerFallback");
  Count(plan.info->qualified);
  size_t num_args = plan.info->args.size();
  auto args = torch::jit::last(*stack, num_args);
  std::vector<LazyImpl*> impls;
  bool any_lazy = false;
  std::vector<c10::IValue> host = HostArguments(plan, args, &impls, &any_lazy);
  plan.handle->callBoxed(&host);
  torch::jit::drop(*stack, num_args);
  for (size_t r = 0; r < host.size(); ++r) {
    c10::IValue& v = host[r];
    int alias = r < plan.return_alias.size() ? plan.return_alias[r] : -1;
    if (v.isTensor() && v.toTensor().defined() && v.toTensor().device().is_cpu()) {
      if (alias >= 0 && impls[alias]) {
        SetSlotValue(impls[alias]->slot(), UploadValue(v.toTensor()));
        stack->push_back(args[alias]);
      } else {
        stack->push_back(WrapOutput(UploadValue(v.toTensor()), !any_lazy));
      }
    } else if (v.isTensorList()) {
      c10::List<at::Tensor> list;
      for (at::Tensor t : v.toTensorList()) list.push_back(WrapOutput(UploadValue(t), !any_lazy));
      stack->push_back(list);
    } else {
      stack->push_back(std::move(v));
    }
  }
}

void AnswerFromMetadata(OpPlan& plan, torch::jit::Stack* stack) {
  // Ops such as is_same_size (called by autograd for every explicit grad_output) only read
  // sizes/dtypes: answering them eagerly would materialize (sync) their inputs for nothing.
  size_t num_args = plan.info->args.size();
  auto args = torch::jit::last(*stack, num_args);
  std::vector<c10::IValue> meta(args.begin(), args.end());
  auto to_meta = [](const at::Tensor& t) -> at::Tensor {
    if (!t.defined()) return t;
    if (LazyImpl* impl = TryGetLazyImpl(t)) {
      const TensorType& type = impl->slot()->value.type();
      return at::empty(type.shape, at::TensorOptions()
                                       .dtype(runtime::ToScalarType(type.dtype))
                                       .device(c10::kMeta));
    }
    return at::empty_strided(t.sizes(), t.strides(), t.options().device(c10::kMeta));
  };
  for (c10::IValue& v : meta) {
    if (v.isTensor()) v = to_meta(v.toTensor());
  }
  plan.handle->callBoxed(&meta);
  torch::jit::drop(*stack, num_args);
  for (c10::IValue& v : meta) stack->push_back(std::move(v));
}

namespace {
const std::thread::id g_import_thread = std::this_thread::get_id();  // Python's main thread
std::atomic<bool> g_recorded_off_main{false};
}  // namespace

bool RecordedOffMainThread() { return g_recorded_off_main.load(std::memory_order_relaxed); }

void LazyFallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  RegisterPendingCustomOps();  // custom ops a library registered since (custom_ops.cc)
  // torch's autograd runs device backward on a worker thread (see torch_spmd/_autograd_exit.py).
  if (std::this_thread::get_id() != g_import_thread)
    g_recorded_off_main.store(true, std::memory_order_relaxed);
  std::lock_guard<std::recursive_mutex> lock(GraphMutex());
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
        shapes->types = plan.custom_shape(conv.meta());
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
  const uint64_t key = ViewLayoutKey(conv.signature(), conv.impl(0));
  auto it = plan.view_layout_cache.find(key);
  return it != plan.view_layout_cache.end() ? &it->second
                                            : &CacheViewLayouts(plan, key, conv.impl(0), conv.meta());
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
