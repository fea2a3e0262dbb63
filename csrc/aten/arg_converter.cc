#include "aten/arg_converter.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <cmath>

#include "aten/backend.h"
#include "aten/recorder.h"
#include "core/hash.h"
#include "runtime/device_data.h"

namespace spmd::aten {

using ir::Arg;

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

at::Tensor MetaOf(const at::Tensor& t) {
  LazyImpl* impl = t.defined() ? TryGetLazyImpl(t) : nullptr;
  if (!impl) return t;
  const TensorType& type = impl->slot()->value.type();
  return at::empty(type.shape,
                   at::TensorOptions().dtype(runtime::ToScalarType(type.dtype)).device(c10::kMeta));
}

// Only tensor-typed arguments are touched: the schema type, not the IValue's tag, is what
// reliably tells an int list from a list of optional tensors (all lists once shared a tag).
c10::IValue ToMeta(const c10::IValue& v, ir::ArgType type) {
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

}  // namespace

ArgConverter::ArgConverter(const OpPlan& plan, c10::ArrayRef<c10::IValue> args) : plan_(plan) {
  args_.reserve(args.size());
  meta_.reserve(args.size());
  impls_.assign(args.size(), nullptr);
  for (size_t i = 0; i < args.size(); ++i) Convert(i, args[i]);
  // A Scalar's value sets the output shape only of an op that reads no tensor (arange's
  // ends); elsewhere only its kind counts (type promotion). So an optimizer's per-step
  // scalars (Adam's bias-corrected step sizes) keep hitting the shape cache.
  if (!reads_tensor_) Mix(scalar_values_);
}

std::vector<c10::IValue>& ArgConverter::meta() {
  if (deferred_meta_) {
    deferred_meta_ = false;
    for (size_t i = 0; i < meta_.size(); ++i) meta_[i] = ToMeta(meta_[i], plan_.info->args[i].type);
  }
  return meta_;
}

void ArgConverter::Mix(uint64_t h) { signature_ = HashCombine(signature_, h); }

void ArgConverter::Convert(size_t i, const c10::IValue& v) {
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
  c10::IValue meta = v;  // the argument for shape inference: kept, unless a case replaces it
  switch (schema.type) {
    case ir::ArgType::kTensor:
      args_.push_back(ConvertTensor(v.toTensor(), &meta, &impls_[i]));
      break;
    case ir::ArgType::kTensorList: args_.push_back(ConvertTensorList(v, &meta)); break;
    case ir::ArgType::kOptionalTensorList:
      args_.push_back(ConvertOptionalTensorList(v, &meta));
      break;
    case ir::ArgType::kScalar: args_.push_back(ConvertScalar(v)); break;
    case ir::ArgType::kScalarList: args_.push_back(ConvertScalarList(v)); break;
    case ir::ArgType::kDevice:
      args_.push_back(Arg{Arg::Kind::kDevice});
      meta = c10::IValue(c10::Device(c10::kMeta));
      Mix(4);
      break;
    default:
      args_.push_back(ConvertPlain(schema.type, v));
      Mix(args_.back().hash());
      break;
  }
  meta_.push_back(std::move(meta));
}

Arg ArgConverter::ConvertTensorList(const c10::IValue& v, c10::IValue* meta) {
  Arg a;
  a.kind = Arg::Kind::kTensorList;
  c10::List<at::Tensor> meta_list;
  for (at::Tensor t : v.toTensorList()) {
    c10::IValue m;
    Arg e = ConvertTensor(t, &m, nullptr);
    if (e.kind != Arg::Kind::kTensor) unsupported = true;  // wrapped numbers in a list
    a.ints.push_back(e.i);
    meta_list.push_back(m.toTensor());
  }
  *meta = c10::IValue(meta_list);
  return a;
}

Arg ArgConverter::ConvertOptionalTensorList(const c10::IValue& v, c10::IValue* meta) {
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
    c10::IValue m;
    // Tensor?[] is the indices of index/index_put, which may live on the host, as with
    // CUDA.
    Arg ea = ConvertTensor(e.toTensor(), &m, nullptr, /*host_ok=*/true);
    if (ea.kind != Arg::Kind::kTensor) unsupported = true;
    a.ints.push_back(ea.i);
    meta_list.push_back(m.toTensor());
  }
  *meta = c10::IValue(meta_list);
  return a;
}

Arg ArgConverter::ConvertScalar(const c10::IValue& v) {
  if (v.isComplexDouble()) unsupported = true;
  Arg a = unsupported ? Arg::None() : ScalarArg(v.toScalar());
  Mix(HashInt(static_cast<int64_t>(a.kind)));
  if (a.is_scalar())
    scalar_values_ = HashCombine(scalar_values_, HashCombine(HashInt(a.i), HashDouble(a.d)));
  return a;
}

// Every value is a run-time input (a list optimizer's step sizes change every step); the kinds
// stay in the key (type promotion). An integer a double cannot hold exactly is not recordable.
Arg ArgConverter::ConvertScalarList(const c10::IValue& v) {
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
  return a;
}

Arg ArgConverter::ConvertPlain(ir::ArgType type, const c10::IValue& v) {
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

Arg ArgConverter::ConvertTensor(const at::Tensor& t, c10::IValue* meta, LazyImpl** impl_out,
                                bool host_ok) {
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
Arg ArgConverter::AddInput(const ir::Value& v) {
  if (v.node->is_data()) static_cast<const runtime::DeviceData&>(*v.node->data()).Upload();
  inputs.push_back(v);
  return Arg::Tensor(static_cast<int64_t>(inputs.size()) - 1);
}

}  // namespace spmd::aten
