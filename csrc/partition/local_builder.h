// Building the per-device program: values with their global layout, local ops, collectives.
#pragma once
#include <map>
#include <unordered_map>
#include <vector>

#include "partition/program.h"
#include "partition/rules/rule.h"

namespace spmd::partition {

// A global value as it exists in the per-device program: the local buffer's value, and how the
// global tensor is laid out (tiling per dim, plus pending partial-sum axes).
struct LocalValue {
  ir::Value value;
  Sharding layout;
  TensorType global;

  Shape local_shape() const { return value.type().shape; }
};

// Appends nodes to the program and records collectives for the statistics.
class ProgramBuilder {
 public:
  explicit ProgramBuilder(MeshPtr mesh) : mesh_(std::move(mesh)) {}

  const MeshPtr& mesh() const { return mesh_; }
  // The scope (module path) of the global node being lowered: every node and collective
  // emitted meanwhile carries it.
  void set_scope(ir::Scope scope) { scope_ = scope; }
  // Whether that node belongs to the backward: see FindReshard.
  void set_in_backward(bool b) { in_backward_ = b; }
  // A local op; `layouts` (one per output) is kept on the node for program dumps.
  ir::NodePtr Emit(const ir::OpInfo* op, std::vector<ir::Value> inputs, std::vector<ir::Arg> args,
                   std::vector<TensorType> outputs, std::vector<Sharding> layouts);
  // A collective or device-dependent helper from internal_ops.h on `x`; `layout` is the
  // result's global layout. Records the collective (kind, axes, group size, bytes).
  ir::Value EmitInternal(const ir::OpInfo* op, const ir::Value& x, std::vector<ir::Arg> attrs,
                         const TensorType& out, const Sharding& layout, const char* kind,
                         const AxisList& axes);
  // Records collective `kind` over `axes` for the statistics: `bytes` is each device's input
  // buffer, `node` the program node (the last one emitted) that carries it out.
  void RecordCollective(const char* kind, const AxisList& axes, int64_t bytes,
                        const ir::Node* node);
  // Marks node `n` as one whose value its reader makes itself on a real pod, never held in
  // device memory (Program::fused_away, whatever the options): an attention mask of global
  // positions, which flash kernels compute from the offsets of their tiles.
  void MarkMadeByReader(const ir::Node* n) { made_by_readers_.push_back(n); }
  const std::vector<const ir::Node*>& made_by_readers() const { return made_by_readers_; }
  // Marks node `n` (one result) as written over its operand `operand` of the same type where
  // that dies at it (Program::in_place): a running sum a lowering accumulates, as eager code
  // adds into it in place.
  void MarkInPlace(const ir::Node* n, int operand) { in_place_.emplace(n, std::vector<int>{operand}); }
  const std::unordered_map<const ir::Node*, std::vector<int>>& in_place() const { return in_place_; }
  // Marks node `n` (a slice read only by kernels that accept strides) as a view of its
  // operand (Program::views), as eager code passes q[..., :half, :] to a kernel.
  void MarkView(const ir::Node* n) { views_.push_back(n); }
  const std::vector<const ir::Node*>& views() const { return views_; }
  std::vector<ir::NodePtr>& nodes() { return nodes_; }
  std::vector<CollectiveStat>& collectives() { return collectives_; }

  // Reshard cache (GSPMD's PartitionedHlo reshard cache): a value moved to a layout once is
  // reused by every later consumer that wants the same layout, instead of repeating the
  // collectives (e.g. one all-reduce of a partial sum read by two ops). A gathered copy (a
  // layout with fewer tiles, bigger per device) made in the forward is not reused by the
  // backward: the backward gathers again, as FSDP (ZeRO-3) and Megatron's sequence parallelism
  // do, instead of keeping every layer's gathered weights and activations live from its forward
  // to its backward (with activation checkpointing, that alone outgrew the checkpoints).
  const LocalValue* FindReshard(const ir::Value& v, const Sharding& from, const Sharding& to) const;
  void AddReshard(const ir::Value& v, const Sharding& from, const Sharding& to,
                  const LocalValue& result);
  // A reduced (non-partial) version of pending partial value `v` already in the program, if a
  // consumer needed one: a graph output can use it instead of staying pending.
  const LocalValue* FindResolved(const ir::Value& v) const;

 private:
  struct ReshardEntry;
  MeshPtr mesh_;
  ir::Scope scope_ = nullptr;
  bool in_backward_ = false;
  std::vector<ir::NodePtr> nodes_;
  std::vector<CollectiveStat> collectives_;
  std::vector<const ir::Node*> made_by_readers_;
  std::vector<const ir::Node*> views_;
  std::unordered_map<const ir::Node*, std::vector<int>> in_place_;
  std::shared_ptr<const std::vector<int64_t>> mesh_shape_;  // shared by the stats
  std::unordered_multimap<Hash, ReshardEntry> reshards_;
  std::map<std::pair<const ir::Node*, int>, LocalValue> resolved_;
};

struct ProgramBuilder::ReshardEntry {
  ir::Value value;
  Sharding from, to;
  LocalValue result;
  bool in_backward;  // the phase of the node that made it
};

// Moves a value into another layout with the collectives it takes (see reshard.cc).
LocalValue Reshard(ProgramBuilder& b, const LocalValue& v, const Sharding& target);

// The padded local shape of `global` under `layout`.
Shape LocalShape(const Shape& global, const Sharding& layout);

// Writes `value` into the padding of v's dims made of sharded factors of an uneven extent.
LocalValue MaskPadding(ProgramBuilder& b, const LocalValue& v, const std::vector<int>& dims,
                       double value);

// `args` with each dynamic scalar given its slot: `first_slot` plus its rank among the dynamic
// args (the graph numbers run-time scalars node by node, arg by arg).
std::vector<ir::Arg> WithScalarSlots(std::vector<ir::Arg> args, int32_t first_slot);

// Lowering context for one node (what a rule's `lower` function sees).
class LocalBuilder {
 public:
  LocalBuilder(ProgramBuilder& program, const ir::Node& node, const ShardingRule& rule,
               std::vector<AxisList> factor_axes, std::vector<Sharding> result_layouts,
               int32_t first_scalar_slot)
      : program_(program), node_(node), rule_(rule), factor_axes_(std::move(factor_axes)),
        result_layouts_(std::move(result_layouts)), first_scalar_slot_(first_scalar_slot) {}

  ProgramBuilder& program() { return program_; }
  const ir::Node& node() const { return node_; }
  const ShardingRule& rule() const { return rule_; }
  const std::vector<AxisList>& factor_axes() const { return factor_axes_; }
  const Sharding& result_layout(int i) const { return result_layouts_.at(i); }
  const Mesh& mesh() const { return *program_.mesh(); }

  // The node's op on local operands, with `args` (default: the node's own args) and local
  // result shapes from the result layouts.
  std::vector<LocalValue> EmitNodeOp(const std::vector<LocalValue>& operands,
                                     std::vector<ir::Arg> args);
  std::vector<LocalValue> EmitNodeOp(const std::vector<LocalValue>& operands) {
    return EmitNodeOp(operands, WithSlots(node_.args()));
  }
  // The node's args (or a rewrite of them, same positions) with run-time scalar slots set.
  std::vector<ir::Arg> WithSlots(std::vector<ir::Arg> args) const {
    return WithScalarSlots(std::move(args), first_scalar_slot_);
  }
  // One of the node's args, with its run-time scalar slot set.
  ir::Arg node_arg(int index) const { return WithSlots(node_.args()).at(index); }
  // An ATen op by qualified name on local values (for multi-op lowerings).
  LocalValue EmitOp(const char* qualified, const std::vector<ir::ArgSchema>& schema,
                    std::vector<ir::Value> inputs, std::vector<ir::Arg> args,
                    const TensorType& local_out, const Sharding& layout, const TensorType& global);
  // v * factor (a constant), keeping v's layout; v itself when factor is 1.
  LocalValue Scale(const LocalValue& v, double factor);
  // Resolves pending partial sums (all-reduce), keeping the tiling.
  LocalValue Resolve(const LocalValue& v) { return Reshard(program_, v, v.layout.WithoutPartial()); }

  // A lowering that runs in steps interleaved with communication (partition/windowed_einsum.h)
  // marks where each step's nodes begin: the partitioner then records the op's cost as one
  // entry per step, each with `share` of its FLOPs and bytes and of its GEMM extent
  // `gemm_extent` ('m', 'n' or 'k'; share 0: an op fused into the step before, which costs
  // nothing but waits for what it reads), so the step-time model overlaps each transfer with
  // the steps around it. A step's first node must be the first to read the collective it
  // waits for (a collective read later inside an op is waited for by the next op).
  struct CostStep {
    size_t first_node;
    double share;
    char gemm_extent;
  };
  void BeginCostStep(double share, char gemm_extent) {
    cost_steps_.push_back(CostStep{program_.nodes().size(), share, gemm_extent});
  }
  const std::vector<CostStep>& cost_steps() const { return cost_steps_; }

 private:
  ProgramBuilder& program_;
  const ir::Node& node_;
  const ShardingRule& rule_;
  std::vector<AxisList> factor_axes_;
  std::vector<Sharding> result_layouts_;
  int32_t first_scalar_slot_;
  std::vector<CostStep> cost_steps_;
};

}  // namespace spmd::partition
