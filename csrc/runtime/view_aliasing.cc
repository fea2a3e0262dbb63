#include "runtime/view_aliasing.h"

#include <ATen/ATen.h>

#include <set>
#include <string>

namespace spmd::runtime {

namespace {

const std::set<std::string>& ReinterpretOps() {
  static const auto* ops = new std::set<std::string>{
      "aten::view_copy",      "aten::_reshape_alias_copy", "aten::_unsafe_view",
      "aten::alias_copy",     "aten::detach_copy",         "aten::squeeze_copy",
      "aten::unsqueeze_copy", "aten::slice_copy",          "aten::expand_copy"};
  return *ops;
}

const std::set<std::string>& PermuteOps() {
  static const auto* ops =
      new std::set<std::string>{"aten::t_copy", "aten::transpose_copy", "aten::permute_copy"};
  return *ops;
}

std::vector<int64_t> ContiguousStrides(const Shape& shape) {
  std::vector<int64_t> strides(shape.size(), 1);
  for (int64_t d = static_cast<int64_t>(shape.size()) - 2; d >= 0; --d)
    strides[d] = strides[d + 1] * std::max<int64_t>(shape[d + 1], 1);
  return strides;
}

}  // namespace

ViewAlias ViewAliasOf(const ir::Node& node) {
  const ir::OpInfo* op = node.op();
  if (op->internal || node.inputs().size() != 1 || node.num_outputs() != 1) return ViewAlias::kNone;
  const TensorType& in = node.input(0).type();
  const TensorType& out = node.output(0);
  if (in.dtype != out.dtype) return ViewAlias::kNone;
  if (PermuteOps().count(op->name)) return ViewAlias::kPermute;
  if (op->name == "aten::select_copy") return ViewAlias::kSubset;
  if (!ReinterpretOps().count(op->name) || NumElements(in.shape) != NumElements(out.shape))
    return ViewAlias::kNone;
  // slice / expand: only the identity (same shape) is a plain view of the whole input.
  if ((op->name == "aten::slice_copy" || op->name == "aten::expand_copy") && in.shape != out.shape)
    return ViewAlias::kNone;
  if (op->name == "aten::_reshape_alias_copy") {
    // (self, size, stride): a plain reshape only with the contiguous strides of `size`.
    const ir::Arg& stride = node.args().at(2);
    if (stride.ints != ContiguousStrides(out.shape)) return ViewAlias::kNone;
  }
  return ViewAlias::kReinterpret;
}

bool IsStrideSensitive(const ir::OpInfo* op) {
  static const auto* ops = new std::set<std::string>{
      "aten::view_copy",       "aten::_reshape_alias_copy", "aten::_unsafe_view",
      "aten::as_strided_copy", "aten::as_strided_scatter",  "aten::view"};
  return !op->internal && ops->count(op->name) > 0;
}

at::Tensor AliasedView(const ir::Node& node, ViewAlias kind, const at::Tensor& input,
                       int64_t batch_dims) {
  const Shape& out = node.output(0).shape;
  std::vector<int64_t> prefix(input.sizes().begin(), input.sizes().begin() + batch_dims);
  if (kind == ViewAlias::kReinterpret) {
    prefix.insert(prefix.end(), out.begin(), out.end());
    return input.view(prefix);
  }
  // Local dims, as the op's (possibly negative) dim args name them, in the batched tensor.
  const int64_t rank = input.dim() - batch_dims;
  auto dim = [&](int64_t d) { return (d < 0 ? d + rank : d) + batch_dims; };
  const std::string& name = node.op()->name;
  if (name == "aten::select_copy") {  // (self, dim, index)
    const int64_t d = dim(node.args().at(1).i);
    const int64_t index = node.args().at(2).i;
    return input.select(d, index < 0 ? index + input.size(d) : index);
  }
  if (name == "aten::t_copy") return rank < 2 ? input : input.transpose(batch_dims, batch_dims + 1);
  if (name == "aten::transpose_copy")
    return input.transpose(dim(node.args().at(1).i), dim(node.args().at(2).i));
  std::vector<int64_t> order;  // permute_copy(self, dims)
  for (int64_t b = 0; b < batch_dims; ++b) order.push_back(b);
  for (int64_t d : node.args().at(1).ints) order.push_back(dim(d));
  return input.permute(order);
}

}  // namespace spmd::runtime
