// A sharding rule printed in Shardy's factor notation, for tests and debugging: the factor
// data of an op (which dims are made of which factors, their sizes and kinds) and the
// properties other layers rely on, as one line of text.
//
//   mm [4,8] x [8,5]:  ([i, j], [j, k]) -> ([i, k]) {i=4, j=8, k=5} reduction={j} sums={j}
//
// Factors are named in the rule's order: i .. z, then a .. h, then f26, f27, ...; a compound
// dim lists its factors major to minor without a separator ([ij]), a dim made of no factor is
// written _. Sets follow the sizes: reduction (with a non-sum combiner in parentheses),
// need_replication, windowed, sums, yields (Factor::priority < 0); then the flags that are true: linear={operands},
// additive, elementwise, reads_extents (the conservative default), reads_strides, view=<its ViewKind>, must_replicate.
#pragma once
#include <string>

#include "partition/rules/rule.h"

namespace spmd::partition {

std::string FactorNotation(const ShardingRule& rule);

}  // namespace spmd::partition
