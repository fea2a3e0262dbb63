// The spmd:: collectives across processes (process_span.h), in two phases so the executor can
// exchange the inputs of several collectives in one call (as XLA's all-reduce combiner merges
// independent all-reduces): a collective whose groups span processes first names the rows it
// needs to send (ExchangeInput), then runs on every process's rows (RunWithExchanged).
#pragma once
#include <ATen/Tensor.h>

#include <vector>

#include "ir/node.h"
#include "runtime/process_span.h"
#include "runtime/stacked.h"

namespace spmd::runtime {

// Whether `node` (an spmd:: op with a stacked kernel) has groups spanning processes of `span`.
bool ExchangesAcrossProcesses(const ir::Node& node, const ProcessSpan& span);
// This process's devices' shards of `x`, [L, *local]: what the others need.
at::Tensor ExchangeInput(const Stacked& x);
// The collective's results (this process's rows), given every process's ExchangeInput
// concatenated in process order ([N, *local]).
std::vector<Stacked> RunWithExchanged(const ir::Node& node, const at::Tensor& all_rows,
                                      const ProcessSpan& span);

}  // namespace spmd::runtime
