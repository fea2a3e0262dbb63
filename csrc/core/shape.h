// Tensor shapes as plain int64 vectors, plus the few helpers every layer needs.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace spmd {

using Shape = std::vector<int64_t>;

int64_t NumElements(const Shape& shape);
std::string ShapeToString(const Shape& shape);  // "[4,8]"

// The static type of one tensor value: what shape inference gives and the executor checks.
struct TensorType {
  DType dtype = DType::kUndefined;
  Shape shape;

  int64_t rank() const { return static_cast<int64_t>(shape.size()); }
  int64_t bytes() const { return NumElements(shape) * ElementSize(dtype); }
  std::string ToString() const;  // "f32[4,8]"
  bool operator==(const TensorType& o) const { return dtype == o.dtype && shape == o.shape; }
  bool operator!=(const TensorType& o) const { return !(*this == o); }
};

// Normalizes a possibly negative dimension index; throws ValueError when out of range.
int64_t WrapDim(int64_t dim, int64_t rank);

int64_t CeilDiv(int64_t a, int64_t b);

}  // namespace spmd
