// Shape functions for ops whose torch 2.x meta kernel disagrees with the CPU kernel the
// devices run (eval-mode native_batch_norm's saved stats, bf16 native_layer_norm's stats,
// torch 2.6's float64 flash attention logsumexp, _scaled_mm's cuBLASLt constraints), and meta kernels for the fused optimizer
// steps torch ships none for.
//
// (torch 1.13 needed about twenty more: missing meta kernels for backward ops, wrong dtypes for
// arange/full, a Python-only convolution. torch 2.6+ gets those right: they are gone.)
#include <ATen/ATen.h>
#include <ATen/OpMathType.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include "aten/shape_functions.h"
#include "runtime/device_data.h"

namespace spmd::aten {

namespace {

// The output types of `op`'s meta kernel for these (meta) arguments.
std::vector<TensorType> MetaTypes(const c10::OperatorHandle& op, const std::vector<c10::IValue>& a) {
  torch::jit::Stack stack(a.begin(), a.end());
  op.callBoxed(&stack);
  std::vector<TensorType> out;
  for (const c10::IValue& v : stack) out.push_back(runtime::TypeOf(v.toTensor()));
  return out;
}

}  // namespace

namespace {

// The dtype the CPU batch-norm kernels keep their saved statistics in: float32 for 16-bit
// input with float32 parameters (their "mixed type"), else the input's (the meta kernels say
// the op-math dtype, float32 for 16-bit input, whatever the parameters).
DType BatchNormStatsType(const std::vector<c10::IValue>& a) {
  for (int i = 1; i <= 4; ++i)  // weight, bias, running_mean, running_var
    if (a[i].isTensor() && a[i].toTensor().defined())
      return runtime::FromScalarType(a[i].toTensor().scalar_type());
  return runtime::FromScalarType(a[0].toTensor().scalar_type());
}

// Whether the op runs in eval mode (its `training` argument false; none: training).
bool EvalMode(const c10::OperatorHandle& op, const std::vector<c10::IValue>& a) {
  const auto& args = op.schema().arguments();
  for (size_t i = 0; i < args.size() && i < a.size(); ++i)
    if (args[i].name() == "training") return !a[i].toBool();
  return false;
}

}  // namespace

// The batch norms (native_batch_norm, _native_batch_norm_legit, _batch_norm_with_update and
// their functional forms): the meta kernel's, except that in eval mode the CPU kernel returns
// empty saved statistics (results 1 and 2; the meta kernel says [C]), their dtype
// (BatchNormStatsType), and the functional forms' updated running statistics in the dtype of
// the running statistics given (the meta kernel says float32 for 16-bit ones).
std::vector<TensorType> BatchNorm(const c10::OperatorHandle& op,
                                  const std::vector<c10::IValue>& a) {
  std::vector<TensorType> out = MetaTypes(op, a);
  if (EvalMode(op, a)) out[1].shape = out[2].shape = {0};
  out[1].dtype = out[2].dtype = BatchNormStatsType(a);
  const auto& returns = op.schema().returns();
  for (size_t r = 3; r < returns.size() && r < out.size(); ++r) {
    const int given = returns[r].name() == "running_mean_out" ? 3
                      : returns[r].name() == "running_var_out" ? 4 : -1;
    if (given >= 0 && a[given].isTensor() && a[given].toTensor().defined())
      out[r].dtype = runtime::FromScalarType(a[given].toTensor().scalar_type());
  }
  return out;
}

// _embedding_bag and _embedding_bag_forward_only (weight, indices, offsets, scale_grad_by_freq,
// mode, sparse, per_sample_weights, include_last_offset, padding_idx): the CPU kernel skips
// offset2bag (empty) in its fast path (mode sum, a float/half/bfloat16 weight with unit row
// stride, no padding_idx), sizes bag_size by the bags, not the offsets (with
// include_last_offset; _embedding_bag_forward_only in mode sum keeps the offsets'), and returns
// max_indices shaped as bag_size outside mode max; the meta kernel says otherwise.
std::vector<TensorType> EmbeddingBag(const c10::OperatorHandle& op,
                                     const std::vector<c10::IValue>& a) {
  std::vector<TensorType> out = MetaTypes(op, a);
  const at::Tensor& weight = a[0].toTensor();
  const int64_t mode = a[4].toInt();
  const bool last_offset = a[7].toBool();
  const int64_t padding_idx = a.size() > 8 && a[8].isInt() ? a[8].toInt() : -1;
  const at::ScalarType w = weight.scalar_type();
  const at::Tensor psw = a[6].isTensor() ? a[6].toTensor() : at::Tensor();
  const bool fast = (w == at::kFloat || w == at::kHalf || w == at::kBFloat16) &&
                    weight.dim() == 2 && weight.stride(1) == 1 && padding_idx < 0 &&
                    (!psw.defined() || psw.stride(0) == 1);
  constexpr int64_t kSum = 0, kMax = 2;
  if (mode == kSum && fast) out[1].shape = {0};
  const bool forward_only = op.schema().name() == "aten::_embedding_bag_forward_only";
  if (last_offset && !(forward_only && mode == kSum))
    out[2].shape = {a[2].toTensor().size(0) - 1};
  if (mode != kMax) out[3] = TensorType{out[3].dtype, out[2].shape};
  return out;
}

// native_layer_norm: the CPU kernel keeps mean/rstd in the input's dtype (bf16 for bf16
// input), where the meta kernel says float32.
std::vector<TensorType> NativeLayerNorm(const c10::OperatorHandle& op,
                                        const std::vector<c10::IValue>& a) {
  std::vector<TensorType> out = MetaTypes(op, a);
  out[1].dtype = out[2].dtype = out[0].dtype;
  return out;
}

// _scaled_dot_product_flash_attention_for_cpu: the CPU kernel keeps logsumexp in the query's
// op-math dtype (float64 for float64 input); torch 2.6's meta kernel says float32 for all
// (later ones agree with the kernel).
std::vector<TensorType> FlashAttentionForCpu(const c10::OperatorHandle& op,
                                             const std::vector<c10::IValue>& a) {
  std::vector<TensorType> out = MetaTypes(op, a);
  out[1].dtype = runtime::FromScalarType(at::toOpMathType(a[0].toTensor().scalar_type()));
  return out;
}

// _scaled_mm(self [m,k], mat2 [k,n], ..., out_dtype): [m,n] of out_dtype (else self's dtype).
// torch's meta kernel checks cuBLASLt's constraints (a column-major mat2, dims divisible by 16),
// which the CPU kernel does not have; a shape it cannot multiply is left to that kernel (the
// recorder then runs it eagerly, and it raises).
std::vector<TensorType> ScaledMm(const c10::OperatorHandle& op,
                                 const std::vector<c10::IValue>& a) {
  const at::Tensor& self = a[0].toTensor();
  const at::Tensor& mat2 = a[1].toTensor();
  TORCH_CHECK(self.dim() == 2 && mat2.dim() == 2 && self.size(1) == mat2.size(0),
              op.schema().name(), ": self ", self.sizes(), " and mat2 ", mat2.sizes(),
              " cannot be multiplied");
  const at::ScalarType out = a[6].isNone() ? self.scalar_type() : a[6].toScalarType();
  return {TensorType{runtime::FromScalarType(out), {self.size(0), mat2.size(1)}}};
}

// _grouped_mm(self, mat2, offs, bias, out_dtype) with offs over the groups: [T, K] x [E, K, N] ->
// [T, N] (experts), [K, T] x [T, N] -> [E, K, N] (their weights' gradient). torch's meta kernel
// checks CUDA's constraints (16-bit operands, 16-byte strides), which the CPU kernel does not
// all have; other forms are left to that kernel (run eagerly).
std::vector<TensorType> GroupedMm(const c10::OperatorHandle& op,
                                  const std::vector<c10::IValue>& a) {
  const at::Tensor& self = a[0].toTensor();
  const at::Tensor& mat2 = a[1].toTensor();
  TORCH_CHECK(self.dim() == 2 && (mat2.dim() == 2 || mat2.dim() == 3) && a[2].isTensor() &&
                  a[2].toTensor().dim() == 1 && a[3].isNone(),
              op.schema().name(), ": self ", self.sizes(), " and mat2 ", mat2.sizes(),
              " are no grouped form the device records");
  const at::ScalarType out = a[4].isNone() ? self.scalar_type() : a[4].toScalarType();
  const int64_t groups = a[2].toTensor().size(0);
  Shape shape = mat2.dim() == 3 ? Shape{self.size(0), mat2.size(2)}
                                : Shape{groups, self.size(0), mat2.size(1)};
  return {TensorType{runtime::FromScalarType(out), std::move(shape)}};
}

namespace {

// Meta kernel for the functional variants of the fused optimizer steps (`_fused_sgd`, ...):
// they return the new value of each of their leading list arguments, so each result list is
// shaped like that argument. torch ships no meta kernel for some of them.
void MirrorLeadingListsMeta(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const auto& schema = op.schema();
  size_t num_args = schema.arguments().size();
  size_t first = stack->size() - num_args;
  std::vector<c10::IValue> results;
  for (size_t r = 0; r < schema.returns().size(); ++r) {
    c10::List<at::Tensor> list;
    for (at::Tensor t : (*stack)[first + r].toTensorList())
      list.push_back(at::empty_like(t, t.options().device(c10::kMeta)));
    results.emplace_back(std::move(list));
  }
  torch::jit::drop(*stack, num_args);
  for (auto& v : results) stack->push_back(std::move(v));
}

}  // namespace

void RegisterMissingMetaKernels() {
  static auto* lib = new torch::Library(torch::Library::IMPL, "aten", c10::DispatchKey::Meta,
                                        __FILE__, __LINE__);
  auto& dispatcher = c10::Dispatcher::singleton();
  for (const c10::OperatorName& name : dispatcher.getAllOpNames()) {
    if (name.name.rfind("aten::_fused_", 0) != 0 || name.name.back() == '_') continue;
    auto op = dispatcher.findOp(name);
    if (!op || !op->hasSchema() || op->hasKernelForDispatchKey(c10::DispatchKey::Meta)) continue;
    const auto& schema = op->schema();
    bool mirrors = !schema.returns().empty() &&
                   schema.returns().size() <= schema.arguments().size();
    for (size_t r = 0; mirrors && r < schema.returns().size(); ++r)
      mirrors = schema.returns()[r].type()->kind() == c10::TypeKind::ListType &&
                schema.arguments()[r].type()->kind() == c10::TypeKind::ListType;
    if (!mirrors) continue;
    std::string short_name = name.name.substr(6);
    if (!name.overload_name.empty()) short_name += "." + name.overload_name;
    lib->impl(short_name.c_str(),
              torch::CppFunction::makeFromBoxedFunction<&MirrorLeadingListsMeta>());
  }
}


}  // namespace spmd::aten
