#include "ir/internal_ops.h"

namespace spmd::ir {

const InternalOps& InternalOps::Get() {
  static const InternalOps* ops = [] {
    auto* o = new InternalOps();
    o->device_data = InternOp("spmd::device_data", {}, 1, /*internal=*/true);
    o->sharding_constraint =
        InternOp("spmd::sharding_constraint", {{"self", ArgType::kTensor}}, 1, true);
    return o;
  }();
  return *ops;
}

}  // namespace spmd::ir
