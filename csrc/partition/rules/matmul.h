// What the aten layer asks the matmul family before recording torch.matmul.
#pragma once
#include "core/shape.h"

namespace spmd::partition {

// Whether torch.matmul(a, b) is recorded as one aten::matmul node (with its own autograd)
// rather than through its composite definition: for two >= 3-D operands with equal batch dims.
// The composite folds the batch dims into one for bmm ([B,H,S,D] -> [B*H,S,D]), and a folded
// dim can carry a sharding only when its sharded factor is the major one, so attention with
// heads sharded would gather at every fold; as one node each batch dim keeps its own factor
// (the contraction rule in matmul.cc, like XLA's dot_general).
bool RecordMatmulWhole(const Shape& a, const Shape& b);

}  // namespace spmd::partition
