// Shape functions for ops whose torch 1.13 meta kernel is missing (convolution_backward),
// wrong (arange(4.) comes out int64) or Python-only and hot (convolution).
#include <ATen/ATen.h>
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

// native_batch_norm(input, weight?, bias?, running_mean?, running_var?, training, momentum,
// eps): the CPU kernel returns empty save_mean/save_invstd in eval mode (in running_mean's
// dtype), [C] statistics in the input dtype when training; the meta kernel says [C] always.
std::vector<TensorType> NativeBatchNorm(const std::vector<c10::IValue>& a) {
  const at::Tensor& input = a[0].toTensor();
  TensorType out{runtime::FromScalarType(input.scalar_type()),
                 Shape(input.sizes().begin(), input.sizes().end())};
  bool training = a[5].toBool();
  c10::ScalarType stat_dtype = input.scalar_type();
  if (!training && a[3].isTensor()) stat_dtype = a[3].toTensor().scalar_type();
  Shape stat_shape{training ? (input.dim() > 1 ? input.size(1) : 1) : 0};
  TensorType stat{runtime::FromScalarType(stat_dtype), stat_shape};
  return {out, stat, stat};
}

const std::unordered_map<std::string, ShapeFn>& Table() {
  static const auto* table = new std::unordered_map<std::string, ShapeFn>{
      {"aten::convolution", Convolution},
      {"aten::convolution_backward", ConvolutionBackward},
      {"aten::native_batch_norm", NativeBatchNorm},
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
