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

// The stacked kernel of spmd op `node` on values held for every device of its mesh (what one
// process holding them all runs; stacked_kernels.cc).
std::vector<Stacked> RunMeshKernel(const ir::Node& node, const std::vector<const Stacked*>& inputs);
// The op on values held for this process's devices only: translated to the mesh kernel, the
// members' shards exchanged first when its groups span processes (one exchange per call; the
// executor batches them instead with the two-phase form below).
std::vector<Stacked> RunSpmdOpAcrossProcesses(const ir::Node& node,
                                              const std::vector<const Stacked*>& inputs,
                                              ProcessSpan& span);

// Whether `node` (an spmd:: op with a stacked kernel) has groups spanning processes of `span`.
bool ExchangesAcrossProcesses(const ir::Node& node, const ProcessSpan& span);
// This process's devices' shards of `x`, [L, *local]: what the others need.
at::Tensor ExchangeInput(const Stacked& x);
// The collective's results (this process's rows), given every process's ExchangeInput
// concatenated in process order ([N, *local]).
std::vector<Stacked> RunWithExchanged(const ir::Node& node, const at::Tensor& all_rows,
                                      const ProcessSpan& span);

// Sums across processes by a chain (fewer bytes, the same bits): when every group of a sum
// all-reduce or reduce-scatter holds members of every process, in process order, process 0
// adds its members of each group in member order, as one process would, and sends the partial
// sums to process 1, which goes on adding its members, and so on; the last process holds the
// groups' sums and broadcasts them. Each process sends one value per group instead of its L
// shards to every other process.
bool ChainsAcrossProcesses(const ir::Node& node, const ProcessSpan& span);
// This process's partial sums, [G, *local] over the G groups: its members added, in member
// order, to `received` (the previous process's partial sums; undefined on process 0).
at::Tensor ChainPartialSums(const ir::Node& node, const Stacked& x, const at::Tensor& received,
                            const ProcessSpan& span);
// An uninitialized [G, *local] tensor: what ChainPartialSums returns (to receive into).
at::Tensor EmptyGroupSums(const ir::Node& node, const Stacked& x);
// The collective's results (this process's rows) from every group's sum ([G, *local]).
std::vector<Stacked> RunWithGroupSums(const ir::Node& node, const at::Tensor& sums,
                                      const ProcessSpan& span);

}  // namespace spmd::runtime
