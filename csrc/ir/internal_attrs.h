// Typed access to the attributes of the partitioner-inserted spmd:: ops (see internal_ops.h for
// their semantics), and the per-device output shape each op produces. The partitioner uses the
// shape to build the node; the runtime's kernels read the attributes and check their results
// against it, so both sides agree on one definition.
#pragma once
#include <cstdint>
#include <utility>
#include <vector>

#include "core/shape.h"
#include "ir/arg.h"
#include "ir/op.h"
#include "sharding/sharding.h"

namespace spmd::ir {

// Every attribute any of the ops has; an op fills the ones its schema names. Read by schema
// name, so an op's argument order lives only in internal_ops.cc.
struct SpmdAttrs {
  int64_t dim = -1;
  AxisList axes;
  int64_t size = -1;
  ReduceOp op = ReduceOp::kSum;
  int64_t split_dim = -1;
  int64_t concat_dim = -1;
  int64_t split_size = -1;
  int64_t concat_size = -1;
  std::vector<std::pair<int64_t, int64_t>> pairs;  // (source, destination) member indices
  int64_t left = 0;
  int64_t right = 0;
  int64_t shift = 0;
  int64_t parts = 1;
  int64_t part = 0;
  double value = 0;

  // Throws std::invalid_argument when an arg has the wrong kind or a value is out of range
  // (a reduce op that is not a ReduceOp, an odd-length pairs list, a negative size).
  static SpmdAttrs Read(const OpInfo& op, const std::vector<Arg>& args);
};

// The per-device output shape of spmd op `op` for a per-device input of shape `input`, where
// the op's groups are over `attrs.axes` of `mesh`. Throws std::invalid_argument for a dim out
// of range or an op that is not a partitioner-inserted spmd op.
Shape SpmdOutputShape(const OpInfo& op, const Shape& input, const SpmdAttrs& attrs,
                      const Mesh& mesh);

}  // namespace spmd::ir
