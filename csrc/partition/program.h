// The compiler's output: one SPMD program, identical on every device. Its nodes are local ops
// (with local, per-device shapes) and spmd:: collectives; its parameters correspond one to one
// to the global graph's parameters, and each output comes with the layout it is produced in.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "ir/graph.h"
#include "partition/op_traits.h"
#include "sharding/sharding.h"

namespace spmd::partition {

struct CollectiveStat {
  std::string kind;       // all-gather, all-reduce, reduce-scatter, all-to-all, collective-permute
  std::vector<std::string> axes;  // mesh axis labels
  int64_t group_size = 0;
  int64_t bytes = 0;      // each device's input buffer
  // The device ids of one group (all groups are alike): whether a group crosses hosts.
  std::vector<int64_t> first_group;
  int64_t mesh_devices = 0;  // devices of the mesh it runs on (how large a TPU slice is used)
  // That mesh's axis sizes, major to minor: how its axes lie along a TPU slice's dimensions
  // (plan/collective_model.h, TorusSidesFor).
  std::shared_ptr<const std::vector<int64_t>> mesh_shape;
  // The links it uses: 0 every link of its group; 1 and 2 one direction each (a
  // collective-permute around a ring, toward the previous or the next member). On a torus, whose
  // links carry each direction on their own, permutes of opposite directions run at once
  // (plan/step_schedule.h). 3 and 4: the host link, to the host (kind device-to-host) and
  // back (host-to-device), beside everything else.
  int channel = 0;
  const ir::Node* node = nullptr;  // the collective in Program::nodes
  std::string scope;  // module path of the op it was emitted for (ir/scope.h)
  int64_t position = 0;  // index of the collective in Program::nodes
  // Where its input is produced and where its result is first read (indices in
  // Program::nodes; -1 for a parameter, there before the step starts; Program::nodes.size()
  // for a result read only as a program output). The step-time model
  // starts a collective once its input exists and makes compute wait only at its first reader
  // (plan/step_schedule.h). Set by LinkCommunication (partition/cost.h); left at -1, a
  // collective is read before the program's first op (no overlap).
  int64_t input_position = -1;
  int64_t first_use_position = -1;
  // A gradient's reduction: its input made by the backward and first read after the backward's
  // last op (by the optimizer, or as the step's result). Set by LinkCommunication.
  bool after_backward = false;
};

// One op of the global graph as the program runs it on each device.
struct OpCost {
  std::string op;            // qualified ATen name
  double flops = 0;          // per device (from the op's sharding rule)
  double model_flops = 0;    // the whole op's, once (model FLOPs for MFU)
  int64_t bytes = 0;         // per device: local operands read plus local results written
  // Of `bytes`, those that never reach HBM in a fused pointwise region: a pointwise op's read
  // of a value that a pointwise op produced for it alone, and that producer's write of it.
  int64_t fused_bytes = 0;
  DType dtype = DType::kFloat32;  // of its first result: picks the peak FLOP/s that applies
  // A contraction (matmul, convolution: its rule's FLOPs are multiply-adds) runs on the matrix
  // units; its per-device GEMM extents, when it is one (ContractionShape in partition/cost.h),
  // let the model charge the padding of each extent to the hardware's tile. 0: not known.
  bool contraction = false;
  int64_t gemm_m = 0, gemm_n = 0, gemm_k = 0, gemm_batch = 1;
  bool view = false;            // its rule's ShardingRule::view: no time of its own
  bool recomputed = false;      // it computes again a value the step computed (ir/recompute.h)
  bool in_backward = false;     // recorded by a backward pass (ir::Node::in_backward)
  std::string scope;            // module path (ir/scope.h)
  int64_t position = 0;         // index in Program::nodes of its first local node
  int64_t end_position = 0;     // one past its last local node
  // Nothing it computes depends on a collective's result (a weight's transpose before its
  // all-gather, a data-parallel backward): a scheduler may run it before ops that wait for
  // communication (plan/step_schedule.h). Set by LinkCommunication (partition/cost.h).
  bool independent_of_collectives = false;
};

struct ProgramStats {
  std::vector<CollectiveStat> collectives;
  int64_t peak_bytes_per_device = 0;  // static estimate from buffer liveness
  // Of its host's memory, the most one device's offloaded values take at once
  // (partition/offload.h).
  int64_t host_peak_bytes_per_device = 0;
  double flops_per_device = 0;
  double model_flops = 0;  // the global graph's FLOPs, each op counted once
  // The part of model_flops spent computing values again (activation checkpointing's
  // recomputed forward; ir/recompute.h): hardware FLOPs, not model FLOPs.
  double recomputed_flops = 0;
  std::vector<OpCost> op_costs;  // in program order
  std::string peak_op;  // the op at which the per-device peak is reached
  // Bytes each device holds in live tensors right after the step (parameters, optimizer
  // state, gradients, ... : everything a tensor still points at). Set by the step, not the
  // compiler.
  int64_t resident_bytes_per_device = 0;
  // The device's peak while the step runs: the program's peak (its parameters and values)
  // plus the data of every other live tensor, which stays on the device meanwhile.
  int64_t device_peak_bytes = 0;
  // What an eager runtime's caching allocator reserves for that peak (its freed blocks kept
  // for reuse: plan/caching_allocator.h): torch.cuda.max_memory_reserved's counterpart.
  int64_t reserved_bytes_per_device = 0;
  std::map<std::string, int64_t> replicated_fallback_ops;  // op name -> count
  // Outputs that leave the program as pending partial results (kind "all-reduce", the axes
  // they are partial over): reduced on the host when read, or by the program that next
  // consumes them.
  std::vector<CollectiveStat> pending_reductions;
};

struct Program {
  std::vector<ir::NodePtr> nodes;     // topological order; params included
  // Per node (parallel to `nodes`): what its rule lets the executor do (op_traits.h). A program
  // built by hand may leave it empty: TraitsAt then answers "nothing".
  std::vector<OpTraits> traits;
  std::vector<ir::NodePtr> params;    // in the global graph's parameter order
  std::vector<Sharding> param_shardings;  // layout each parameter must arrive in
  std::vector<ir::Value> outputs;     // in the global graph's output order
  std::vector<Sharding> output_shardings;  // invalid = replicated
  std::vector<TensorType> output_global_types;
  ProgramStats stats;
  // Nodes whose result a compiling runtime computes inside its reader's fusion: it takes no
  // device memory (PartitionOptions::fused_memory, partition/cost.h).
  std::unordered_set<const ir::Node*> fused_away;
  // Nodes whose results are written over operands in place (ShardingRule::updates_operand; and
  // under PartitionOptions::fused_memory, an elementwise op over an operand of its size that
  // dies there, as XLA's buffer assignment shares it): per result, that operand's input index,
  // or -1.
  std::unordered_map<const ir::Node*, std::vector<int>> in_place;
  // Nodes a lowering emitted as views of their first operand (a kernel reading part of a
  // tile through strides): no bytes of their own; the operand lives as long as they are read.
  std::unordered_set<const ir::Node*> views;
  std::string ToText() const;
  const OpTraits& TraitsAt(size_t node_index) const;
};

}  // namespace spmd::partition
