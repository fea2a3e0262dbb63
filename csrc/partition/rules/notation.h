// A sharding rule printed in Shardy's factor notation, for tests and debugging: the factor
// data of an op (which dims are made of which factors, their sizes and kinds) and the
// properties other layers rely on, as one line of text.
//
//   mm [4,8] x [8,5]:  ([i, k], [k, j]) -> ([i, j]) {i=4, k=8, j=5} reduction={k} sums={k}
//
// Factors are named i, j, k, ... in the rule's order (then f26, f27, ...); a compound dim lists
// its factors major to minor without a separator ([ij]), a dim made of no factor is [] inside
// the list ("_"). Sets follow the sizes: reduction (with a non-sum combiner in parentheses),
// need_replication, windowed, sums; then the flags set: linear={operands}, additive,
// elementwise, reads_extents, view, must_replicate.
#pragma once
#include <string>

#include "partition/rules/rule.h"

namespace spmd::partition {

std::string FactorNotation(const ShardingRule& rule);

}  // namespace spmd::partition
