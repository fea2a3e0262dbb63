// Shape bookkeeping on the host.
//
// A decoding loop (Hugging Face's `generate`) keeps its token ids, positions and attention
// mask in integer tensors that grow by one column per token: every token it appends the new
// token to the ids (torch.cat) and hands the forward the last column (a slice). Recorded into
// the graphs, those ops take the whole grown tensor in or out, so every token's graph has new
// shapes and compiles a new program, a static KV cache or not. Run on the host instead, as a
// JAX or torch.compile program's Python loop runs them, they leave the graphs only fixed-size
// values: the token's forward is one cached program.
//
// Which ops: those whose operands and results are integer or boolean values of at most
// DeviceData::kKnownValueBytes (DeviceData::KeepsKnownValue: what Python code reads to steer a
// loop), that draw no random numbers and write no argument, with every data operand replicated
// and its values known (real data, or planned data with a known value), and either
//  - every operand data, and the op a view (reshape, permutation, subset) or a join
//    (ShardingRule::joins: cat, stack, a constant pad), or any op when an operand was made by
//    host bookkeeping: what is computed from the loop's host values stays on the host (the
//    slice of the ids the next forward takes, the mask cast and padded to the cache's length,
//    the stop flags). Other integer ops on uploaded data are the program's, as on a device;
//  - a join of such data with pending values, which are synced first: a graph cut, as a
//    PyTorch/XLA user's mark_step after the forward. Not in plan mode, where the join is
//    recorded as usual (a planned step per token: no).
// The results are replicated data, marked as made by host bookkeeping.
#pragma once
#include <ATen/core/dispatch/Dispatcher.h>

#include <vector>

#include "aten/op_plan.h"
#include "ir/node.h"

namespace spmd::aten {

// Whether the op `node` records is host bookkeeping (above).
bool RunsOnHost(const OpPlan& plan, const ir::Node& node);

// The op's results computed on the host from its arguments, uploaded as replicated data: one
// value per tensor result (each element of a list result).
std::vector<ir::Value> ComputeOnHost(const OpPlan& plan, c10::ArrayRef<c10::IValue> args);

}  // namespace spmd::aten
