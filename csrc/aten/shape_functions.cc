// Shape functions for ops whose torch 1.13 meta kernel is missing (convolution_backward),
// wrong (arange(4.) comes out int64, full(.., 7) float32, eval-mode native_batch_norm's saved
// stats [C] instead of [0]) or Python-only and hot (convolution).
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/lazy/core/shape_inference.h>

#include <cmath>
#include <unordered_map>

#include "aten/op_plan.h"
#include "runtime/device_data.h"

namespace spmd::aten {

namespace {

TensorType FromLazyShape(const torch::lazy::Shape& s) {
  return TensorType{runtime::FromScalarType(s.scalar_type()),
                    Shape(s.sizes().begin(), s.sizes().end())};
}

std::vector<TensorType> Convolution(const std::vector<c10::IValue>& a) {
  auto shapes = torch::lazy::compute_shape_convolution(
      a[0].toTensor(), a[1].toTensor(), a[2].toOptional<at::Tensor>(), a[3].toIntVector(),
      a[4].toIntVector(), a[5].toIntVector(), a[6].toBool(), a[7].toIntVector(), a[8].toInt());
  return {FromLazyShape(shapes.at(0))};
}

std::vector<TensorType> ConvolutionBackward(const std::vector<c10::IValue>& a) {
  // (grad_output, input, weight, bias_sizes?, stride, padding, dilation, transposed,
  //  output_padding, groups, output_mask)
  c10::optional<std::vector<int64_t>> bias_sizes;
  if (!a[3].isNone()) bias_sizes = a[3].toIntVector();
  std::vector<bool> mask_list = a[10].toBoolList().vec();
  std::array<bool, 3> mask{mask_list[0], mask_list[1], mask_list[2]};
  auto shapes = torch::lazy::compute_shape_convolution_backward(
      a[0].toTensor(), a[1].toTensor(), a[2].toTensor(),
      bias_sizes ? at::OptionalIntArrayRef(*bias_sizes) : at::OptionalIntArrayRef(),
      a[4].toIntVector(), a[5].toIntVector(), a[6].toIntVector(), a[7].toBool(),
      a[8].toIntVector(), a[9].toInt(), mask);
  std::vector<TensorType> out;
  for (int i = 0; i < 3; ++i) {
    TensorType t = FromLazyShape(shapes.at(i));
    if (!mask[i]) t = TensorType{DType::kUndefined, {}};  // the kernel returns no tensor
    out.push_back(t);
  }
  return out;
}

// _adaptive_avg_pool2d_backward(grad_output, self) -> like self (torch 1.13 has no meta kernel,
// so without this the op would run eagerly).
std::vector<TensorType> LikeSelf(const std::vector<c10::IValue>& a) {
  return {runtime::TypeOf(a[1].toTensor())};
}

// arange(end | start, end | start, end, step, dtype=None, ...): ATen's length formula, and
// the dtype rule the Python meta kernel gets wrong: floating if any bound is floating.
std::vector<TensorType> Arange(const std::vector<c10::IValue>& a, int num_bounds) {
  double start = 0, end = 0, step = 1;
  bool floating = false;
  auto value = [&](const c10::IValue& v) {
    floating |= v.isDouble();
    return v.isDouble() ? v.toDouble() : static_cast<double>(v.toInt());
  };
  if (num_bounds == 1) {
    end = value(a[0]);
  } else {
    start = value(a[0]);
    end = value(a[1]);
    if (num_bounds == 3) step = value(a[2]);
  }
  TORCH_CHECK(step != 0, "step must be nonzero");
  TORCH_CHECK(std::isfinite(start) && std::isfinite(end), "unsupported range: ", start, " -> ",
              end);
  double len = std::ceil((end - start) / step);
  TORCH_CHECK(len >= 0, "upper bound and larger bound inconsistent with step sign");
  const c10::IValue& dtype_arg = a[num_bounds];
  c10::ScalarType dtype = !dtype_arg.isNone() ? static_cast<c10::ScalarType>(dtype_arg.toInt())
                          : floating ? c10::typeMetaToScalarType(c10::get_default_dtype())
                                     : c10::kLong;
  return {TensorType{runtime::FromScalarType(dtype), {static_cast<int64_t>(len)}}};
}

TensorType TypeOfArg(const c10::IValue& v) { return runtime::TypeOf(v.toTensor()); }

// The output types of `op`'s meta kernel for these (meta) arguments.
std::vector<TensorType> MetaTypes(const char* name, const char* overload,
                                  const std::vector<c10::IValue>& a) {
  const c10::OperatorHandle op = c10::Dispatcher::singleton().findSchemaOrThrow(name, overload);
  torch::jit::Stack stack(a.begin(), a.end());
  op.callBoxed(&stack);
  std::vector<TensorType> out;
  for (const c10::IValue& v : stack) out.push_back(runtime::TypeOf(v.toTensor()));
  return out;
}

// native_batch_norm: the meta kernel's, except that in eval mode the CPU kernel returns empty
// save_mean/save_invstd (the meta kernel says [C]).
std::vector<TensorType> NativeBatchNorm(const std::vector<c10::IValue>& a) {
  std::vector<TensorType> out = MetaTypes("aten::native_batch_norm", "", a);
  if (!a[5].toBool()) out[1].shape = out[2].shape = {0};
  return out;
}

// native_layer_norm: the CPU kernel keeps mean/rstd in the input's dtype (bf16 for bf16
// input), where the meta kernel says float32.
std::vector<TensorType> NativeLayerNorm(const std::vector<c10::IValue>& a) {
  std::vector<TensorType> out = MetaTypes("aten::native_layer_norm", "", a);
  out[1].dtype = out[2].dtype = out[0].dtype;
  return out;
}

// cummax/cummin(self, dim): values like self, int64 indices.
std::vector<TensorType> CumMaxMin(const std::vector<c10::IValue>& a) {
  TensorType self = TypeOfArg(a[0]);
  return {self, TensorType{DType::kInt64, self.shape}};
}

// full(size, fill_value, dtype=None, ...): without a dtype, the fill value's kind decides
// (bool, long, or the default floating dtype); the meta path always says the default dtype.
std::vector<TensorType> Full(const std::vector<c10::IValue>& a) {
  c10::ScalarType dtype;
  if (!a[2].isNone()) {
    dtype = static_cast<c10::ScalarType>(a[2].toInt());
  } else {
    c10::Scalar fill = a[1].toScalar();
    dtype = fill.isBoolean()        ? c10::kBool
            : fill.isIntegral(false) ? c10::kLong
            : fill.isComplex()       ? c10::toComplexType(c10::typeMetaToScalarType(
                                     c10::get_default_dtype()))
                                     : c10::typeMetaToScalarType(c10::get_default_dtype());
  }
  std::vector<int64_t> size;
  for (const c10::IValue& v : a[0].toListRef())
    size.push_back(v.isInt() ? v.toInt() : v.toSymInt().expect_int());
  return {TensorType{runtime::FromScalarType(dtype), Shape(size.begin(), size.end())}};
}

// Ops without a meta kernel on 1.13 whose output is shaped like one of their tensor arguments
// (mostly backward kernels). Without these they ran eagerly, cutting the graph every step.
ShapeFn LikeArg(size_t i) {
  return [i](const std::vector<c10::IValue>& a) { return std::vector<TensorType>{TypeOfArg(a[i])}; };
}

// unfold_backward(grad_in, input_sizes, dim, size, step)
std::vector<TensorType> UnfoldBackward(const std::vector<c10::IValue>& a) {
  std::vector<int64_t> sizes = a[1].toIntVector();
  return {TensorType{TypeOfArg(a[0]).dtype, Shape(sizes.begin(), sizes.end())}};
}

// nll_loss2d_forward(self [N,C,H,W], target [N,H,W], weight?, reduction, ignore_index)
std::vector<TensorType> NllLoss2dForward(const std::vector<c10::IValue>& a) {
  TensorType self = TypeOfArg(a[0]), target = TypeOfArg(a[1]);
  TORCH_CHECK(self.shape.size() == 4 && target.shape.size() == 3 &&
                  self.shape[0] == target.shape[0] && self.shape[2] == target.shape[1] &&
                  self.shape[3] == target.shape[2],
              "nll_loss2d: expected input [N, C, H, W] and target [N, H, W], got ",
              self.ToString(), " and ", target.ToString());
  TensorType out{self.dtype, a[3].toInt() == 0 ? target.shape : Shape{}};
  return {out, TensorType{self.dtype, {}}};
}

// kthvalue(self, k, dim, keepdim), median.dim / mode / nanmedian.dim(self, dim, keepdim):
// values and int64 indices with `dim` reduced.
std::vector<TensorType> ReduceDimWithIndices(const std::vector<c10::IValue>& a, size_t dim_arg) {
  TensorType self = TypeOfArg(a[0]);
  int64_t rank = static_cast<int64_t>(self.shape.size());
  int64_t dim = c10::maybe_wrap_dim(a[dim_arg].toInt(), std::max<int64_t>(rank, 1));
  if (dim_arg == 2) {  // kthvalue: k must be in range, as the kernel checks
    int64_t k = a[1].toInt(), n = rank == 0 ? 1 : self.shape[dim];
    TORCH_CHECK(k >= 1 && k <= n, "kthvalue(): selected number k out of range for dimension ",
                dim);
  }
  Shape shape = self.shape;
  if (rank > 0) {
    if (a[dim_arg + 1].toBool()) shape[dim] = 1;
    else shape.erase(shape.begin() + dim);
  }
  return {TensorType{self.dtype, shape}, TensorType{DType::kInt64, shape}};
}

const std::unordered_map<std::string, ShapeFn>& Table() {
  static const auto* table = new std::unordered_map<std::string, ShapeFn>{
      {"aten::convolution", Convolution},
      {"aten::convolution_backward", ConvolutionBackward},
      {"aten::native_batch_norm", NativeBatchNorm},
      {"aten::full", Full},
      {"aten::native_layer_norm", NativeLayerNorm},
      {"aten::cummax", CumMaxMin},
      {"aten::cummin", CumMaxMin},
      {"aten::logcumsumexp", LikeArg(0)},
      {"aten::reflection_pad1d_backward", LikeArg(1)},
      {"aten::reflection_pad2d_backward", LikeArg(1)},
      {"aten::replication_pad1d_backward", LikeArg(1)},
      {"aten::replication_pad2d_backward", LikeArg(1)},
      {"aten::_adaptive_avg_pool2d_backward", LikeArg(1)},
      {"aten::smooth_l1_loss_backward", LikeArg(1)},
      {"aten::huber_loss_backward", LikeArg(1)},
      {"aten::nll_loss2d_backward", LikeArg(1)},
      {"aten::unfold_backward", UnfoldBackward},
      {"aten::nll_loss2d_forward", NllLoss2dForward},
      {"aten::kthvalue", [](const auto& a) { return ReduceDimWithIndices(a, 2); }},
      {"aten::median.dim", [](const auto& a) { return ReduceDimWithIndices(a, 1); }},
      {"aten::nanmedian.dim", [](const auto& a) { return ReduceDimWithIndices(a, 1); }},
      {"aten::mode", [](const auto& a) { return ReduceDimWithIndices(a, 1); }},
      {"aten::arange", [](const auto& a) { return Arange(a, 1); }},
      {"aten::arange.start", [](const auto& a) { return Arange(a, 2); }},
      {"aten::arange.start_step", [](const auto& a) { return Arange(a, 3); }},
  };
  return *table;
}

}  // namespace

const ShapeFn* FindCustomShapeFn(const std::string& qualified_name) {
  auto it = Table().find(qualified_name);
  return it == Table().end() ? nullptr : &it->second;
}

}  // namespace spmd::aten
