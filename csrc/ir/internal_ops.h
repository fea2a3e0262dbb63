// The spmd:: ops: graph parameters, user sharding constraints, and the collectives and
// device-dependent helpers that the partitioner inserts. The runtime executes them natively.
#pragma once
#include "ir/op.h"

namespace spmd::ir {

struct InternalOps {
  const OpInfo* device_data;          // graph parameter; node->data() holds the buffers
  const OpInfo* sharding_constraint;  // identity; shardings()[0] is the user's annotation
  static const InternalOps& Get();
};

}  // namespace spmd::ir
