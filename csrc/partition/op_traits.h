// What a local op's sharding rule lets the executor do with it. The compiler derives these once
// per op of a program (Program::traits) so that the runtime runs what it is handed without
// consulting the rules itself: the rules stay the compiler's, their execution-relevant facts
// travel in the program.
#pragma once
#include <vector>

#include "ir/node.h"

namespace spmd::partition {

// How a view op's result lies in its operand's memory (ShardingRule::view), declared by the
// op's rule: the step-time model charges a view nothing, and the executor returns a view of
// the operand's host memory instead of a copy where the kind allows (runtime/view_aliasing.h).
enum class ViewKind {
  kNone,     // not a view: the op computes its result
  kReshape,  // the operand's elements in row-major order, reshaped (view, squeeze, alias; a
             // slice or expand that keeps exactly the operand's elements is one too)
  kPermute,  // the operand's dims reordered (t, transpose, permute): a strided result
  kSubset,   // some of the operand's elements (select): a strided result
  kOther,    // another view (a broadcast, explicit strides): costs nothing, copied when run
};

// One factor of the op's rule, as far as the executor may use it.
struct TraitFactor {
  enum class Use {
    kNone,
    // A pass-through factor, neither windowed nor reading its whole dim: the op on inputs
    // whose rows are concatenated along it is the op on each row, side by side
    // (runtime/row_merge.h).
    kMerge,
    // A reduction factor the op adds its terms up over (Factor::sums): the op on operands
    // concatenated along it is the sum of the op on each part (runtime/fold.h).
    kFold,
  };
  Use use = Use::kNone;
  std::vector<int> operand_dim;  // per operand: its dim of this factor (-1: none, -2: compound)
  std::vector<int> result_dim;   // per result, likewise
};

struct OpTraits {
  bool elementwise = false;  // ShardingRule::elementwise: runs as it is on stacked operands
  // Rows may be merged: the op has no shape-valued arguments to rewrite per device and does not
  // read its operands' extents (ShardingRule::local_args, reads_extents).
  bool mergeable = false;
  // ShardingRule::additive: op(a1 + a2, b1 + b2) = op(a1, b1) + op(a2, b2) over all its tensor
  // operands together (add, sub, cat, stack), so a sum over devices may be taken before it as well as after.
  bool additive = false;
  ViewKind view = ViewKind::kNone;  // ShardingRule::view
  // ShardingRule::reads_strides: the op reads its operands' memory layout, so they must reach
  // it contiguous. True for an op without a rule (nothing says otherwise).
  bool reads_strides = true;
  // The rule's factors, when its operands and results match the node's (else empty).
  std::vector<TraitFactor> factors;
};

// The traits of `node` (a local op of a program) from its rule; none for ops without one.
OpTraits TraitsOf(const ir::Node& node);

}  // namespace spmd::partition
