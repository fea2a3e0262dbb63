#include "runtime/view_aliasing.h"

#include <ATen/ATen.h>

namespace spmd::runtime {

ViewKind ViewAliasOf(const ir::Node& node, const partition::OpTraits& traits) {
  if (node.op()->internal || node.inputs().size() != 1 || node.num_outputs() != 1)
    return ViewKind::kNone;
  const TensorType& in = node.input(0).type();
  const TensorType& out = node.output(0);
  if (in.dtype != out.dtype) return ViewKind::kNone;
  const bool every_element = NumElements(in.shape) == NumElements(out.shape);
  switch (traits.view) {
    case ViewKind::kReshape:  // a slice or expand only when it keeps the input as it is
      return every_element ? ViewKind::kReshape : ViewKind::kNone;
    case ViewKind::kSubset:
      return every_element ? ViewKind::kReshape : ViewKind::kSubset;
    case ViewKind::kPermute:
      return ViewKind::kPermute;
    default:
      return ViewKind::kNone;
  }
}

at::Tensor ReshapedView(const ir::Node& node, const at::Tensor& input, int64_t batch_dims) {
  std::vector<int64_t> shape(input.sizes().begin(), input.sizes().begin() + batch_dims);
  const Shape& out = node.output(0).shape;
  shape.insert(shape.end(), out.begin(), out.end());
  return input.view(shape);
}

}  // namespace spmd::runtime
