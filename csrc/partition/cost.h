// Static analysis of a partitioned program, without running it: the cost of each op (FLOPs
// from its sharding rule's iteration space, bytes from its local operand and result types)
// and the per-device peak of live buffer bytes (from liveness).
#pragma once
#include "partition/factor_assignment.h"
#include "partition/program.h"
#include "partition/rules/rule.h"

namespace spmd::partition {

// A value of the program (one output of one node) and the span it is live for, in node
// indices: from its definition to its last reader (the end for outputs and kept parameters).
// A view's result holds no bytes; it keeps the value it views live while it is read.
struct LiveValue {
  const ir::Node* node;
  int output;
  int defined_at;
  int last_use;
  int64_t bytes;  // per device, of its memory
  int64_t host_bytes = 0;  // per device, of its host's memory (offloaded: partition/offload.h)
};
std::vector<LiveValue> ValueLifetimes(const Program& program,
                                      const std::vector<bool>* donated = nullptr);
// Bytes live on one device while each node runs (its inputs and its outputs included).
std::vector<int64_t> LiveBytesTimeline(const Program& program,
                                       const std::vector<bool>* donated = nullptr);
// The most bytes one device holds in its host's memory at once (values offloaded there).
int64_t PeakHostBytesPerDevice(const Program& program);

// Peak bytes held by one device while the program runs: parameters stay live throughout
// (donated ones, `donated[i]` for program.params[i], only until their last use, as the
// runtime frees them), every other value from its definition to its last use (outputs to the
// end). `at_node`, when given, receives the index in program.nodes of the op at which the peak
// is first reached.
int64_t PeakBytesPerDevice(const Program& program, int64_t* at_node = nullptr,
                           const std::vector<bool>* donated = nullptr);

// FLOPs of an op whose rule is `rule`, each factor split over the mesh axes `fa` assigns it
// (FactorAxes of empty lists: the whole op): rule.cost.flops_per_point per point of the iteration
// space, or one per element of `results` (the result types with the same split applied) when
// the rule leaves it unset.
double RuleFlops(const ShardingRule& rule, const Mesh& mesh, const FactorAxes& fa,
                 const std::vector<TensorType>& results);
// One FLOP per result element: ops without a rule (run whole, replicated).
double ElementFlops(const std::vector<TensorType>& results);

// A pointwise op (an elementwise rule with one FLOP per element; not matmul, whose batch dims
// are elementwise too): such ops fuse into one kernel with the pointwise ops around them, as
// XLA fuses loops and torch.compile/Inductor fuses pointwise chains.
bool IsPointwise(const ShardingRule& rule);
// The dtype node `n` computes in (its cost entry's dtype, which picks the peak FLOP/s): its
// result's, or the operand's its rule names (ShardingRule::Cost::compute_dtype_operand).
DType ComputeDType(const ir::Node& n, const ShardingRule* rule);

// The GEMM a contraction's rule describes, per device: its two operands carrying contracted
// factors (factors in no result) are the matrices; the result's factors found only in the
// first make M, only in the second N, in both a batch; contracted factors make K. Each
// factor counts with its local (padded) tile under `fa`. mm [i,k],[k,j] -> [i,j] is M = i,
// K = k, N = j; a convolution is M = batch x output space, K = input channels x kernel taps,
// N = output channels. All zero for other rules (several results, as a convolution backward).
struct GemmShape {
  int64_t m = 0, n = 0, k = 0;
  int64_t batch = 1;  // independent GEMMs of that shape (a batched matmul's batch dims)
};
GemmShape ContractionShape(const ShardingRule& rule, const Mesh& mesh, const FactorAxes& fa);

// Sets what `rule` under `fa` makes of `c` besides its bytes: FLOPs on the `local` result
// types, whether it is a contraction and its GEMM extents, whether it is a view. The
// partitioner records each op so; the layout ILP's coefficients price candidate axes so.
void SetRuleCost(OpCost& c, const ShardingRule& rule, const Mesh& mesh, const FactorAxes& fa,
                 const std::vector<TensorType>& local);

// Where communication meets compute in `nodes`, the program `collectives` and `ops` were
// recorded for (program.h): each collective's input_position, first_use_position and
// after_backward, and whether each op is independent_of_collectives.
void LinkCommunication(const std::vector<ir::NodePtr>& nodes,
                       std::vector<CollectiveStat>& collectives, std::vector<OpCost>& ops);

}  // namespace spmd::partition
