#include "core/shape.h"

#include "core/error.h"

namespace spmd {

int64_t NumElements(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string ShapeToString(const Shape& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ",";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

std::string TensorType::ToString() const { return DTypeName(dtype) + ShapeToString(shape); }

int64_t WrapDim(int64_t dim, int64_t rank) {
  int64_t r = rank == 0 ? 1 : rank;  // scalars accept dim 0 / -1, as in ATen
  SPMD_CHECK_VALUE(dim >= -r && dim < r, "Dimension out of range (expected to be in range of [",
                   -r, ", ", r - 1, "], but got ", dim, ")");
  return dim < 0 ? dim + r : dim;
}

int64_t CeilDiv(int64_t a, int64_t b) { return b == 0 ? 0 : (a + b - 1) / b; }

}  // namespace spmd
