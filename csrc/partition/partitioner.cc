#include "partition/partitioner.h"

#include <algorithm>
#include <unordered_map>

#include "core/error.h"
#include "ir/internal_ops.h"
#include "ir/recompute.h"
#include "partition/cost.h"
#include "partition/factor_assignment.h"
#include "partition/local_builder.h"
#include "partition/offload.h"
#include "partition/propagate.h"
#include "partition/simplify.h"
#include "partition/ring.h"
#include "partition/windowed_einsum.h"

namespace spmd::partition {

namespace {

// The mesh the graph's annotations live on: the first tiled constraint's (a constraint can
// only be met on its own mesh), else the first tiled (or partial) parameter's (parameters on
// another mesh are relaid out on the host). A replicated layout says nothing about the mesh
// (plain uploads carry a default one), so it only decides when nothing is tiled; otherwise a
// replicated parameter listed first would make every sharded one look foreign and be gathered
// on the host.
MeshPtr FindMesh(const ir::Graph& graph, const ParamLayouts* overrides) {
  const auto& ops = ir::InternalOps::Get();
  MeshPtr tiled_param, fallback;
  for (const ir::NodePtr& n : graph.nodes) {
    const Sharding* s = nullptr;
    const bool constraint = n->op() == ops.sharding_constraint || n->op() == ops.full_to_shard ||
                            n->op() == ops.shard_to_full;
    if (n->is_data() && LayoutOfData(*n, overrides).valid()) s = &LayoutOfData(*n, overrides);
    if (constraint) s = &n->shardings().at(0);
    if (!s || s->is_manual()) continue;  // a manual annotation says nothing about the mesh
    if (!s->IsReplicated()) {
      if (constraint) return s->mesh_ptr();
      if (!tiled_param) tiled_param = s->mesh_ptr();
    }
    if (!fallback) fallback = s->mesh_ptr();
  }
  return tiled_param ? tiled_param : fallback;
}

class Partitioner {
 public:
  Partitioner(const ir::Graph& graph, MeshPtr mesh, const PartitionOptions& options)
      : graph_(graph), mesh_(mesh), options_(options), prop_(graph, mesh, options.param_layouts), builder_(mesh),
        recomputed_(ir::RecomputedNodes(graph)) {
    int32_t slot = 0;
    for (const ir::NodePtr& n : graph.nodes)
      for (const ir::Value& in : n->inputs()) {
        ++uses_[{in.node.get(), in.index}];
        reader_[{in.node.get(), in.index}] = n.get();
      }
    for (const ir::Value& out : graph.outputs) ++uses_[{out.node.get(), out.index}];
    for (const ir::NodePtr& n : graph.nodes) {
      scalar_base_[n.get()] = slot;
      for (const ir::Arg& a : n->args()) slot += a.num_slots();
    }
    // Weights: device data, and what pointwise ops and views make of weights alone (a
    // parameter cast to the compute dtype, transposed). Their gathers wait for no compute.
    for (const ir::NodePtr& n : graph.nodes) {
      if (n->is_data()) {
        weights_.insert(n.get());
        continue;
      }
      const ShardingRule* rule = prop_.RuleOf(n.get());
      if (!rule || n->inputs().empty() ||
          !(IsPointwise(*rule) || rule->executor.view != ViewKind::kNone))
        continue;
      bool all = true;
      for (const ir::Value& in : n->inputs()) all &= weights_.count(in.node.get()) > 0;
      if (all) weights_.insert(n.get());
    }
  }

  Program Run() {
    Program program;
    const auto& ops = ir::InternalOps::Get();
    for (const ir::NodePtr& n : graph_.nodes) {
      builder_.set_scope(n->scope());
      builder_.set_in_backward(n->in_backward());
      if (n->is_data()) {
        locals_[n.get()] = {Parameter(*n, program)};
      } else if (n->op() == ops.sharding_constraint) {
        locals_[n.get()] = {Constrain(*n)};
      } else if (n->op() == ops.place_to_host || n->op() == ops.place_to_device) {
        locals_[n.get()] = {OverHostLink(*n)};
      } else if (n->op() == ops.full_to_shard) {
        // Each device's shard becomes a tensor of its own: the same buffer, manual.
        LocalValue v = Reshard(builder_, Local(n->input(0)), n->shardings().at(0));
        locals_[n.get()] = {LocalValue{v.value, Sharding::Manual(mesh_, n->output(0).rank()),
                                       n->output(0)}};
      } else if (n->op() == ops.shard_to_full) {
        const LocalValue& v = Local(n->input(0));
        SPMD_CHECK_VALUE(v.layout.is_manual(),
                         "shard_to_full needs a manually sharded value (enable_manual_sharding "
                         "or _mark_manual_sharding), got one laid out as ", v.layout.ToString());
        locals_[n.get()] = {LocalValue{
            v.value, OnMesh(n->shardings().at(0), mesh_, n->output(0).rank()), n->output(0)}};
      } else {
        if (HasManualOperand(*n))
          LowerManual(*n);
        else
          LowerNode(*n);
        costs_.back().end_position = static_cast<int64_t>(builder_.nodes().size());
      }
    }
    for (const ir::Value& out : graph_.outputs) {
      builder_.set_scope(out.node->scope());
      LocalValue v = Local(out);
      if (v.layout.IsPartial()) {
        // A pending sum that the program reduced anyway leaves it reduced.
        if (const LocalValue* r = builder_.FindResolved(v.value))
          v = *r;
        else if (!options_.defer_output_reductions)
          v = Reshard(builder_, v, CompleteLayout(out, v.layout));
      }
      program.outputs.push_back(v.value);
      program.output_shardings.push_back(v.layout);
      program.output_global_types.push_back(out.type());
      if (v.layout.IsPartial()) {
        CollectiveStat pending;
        pending.kind = "all-reduce";
        for (int a : v.layout.partial_axes()) pending.axes.push_back(mesh_->AxisLabel(a));
        pending.group_size = AxesSize(*mesh_, v.layout.partial_axes());
        pending.bytes = v.value.type().bytes();
        program.stats.pending_reductions.push_back(std::move(pending));
      }
    }
    program.nodes = std::move(builder_.nodes());
    if (options_.executor_traits)
      for (const ir::NodePtr& n : program.nodes) program.traits.push_back(TraitsOf(*n));
    program.stats.collectives = std::move(builder_.collectives());
    LinkCommunication(program.nodes, program.stats.collectives, costs_);
    program.stats.replicated_fallback_ops = std::move(fallbacks_);
    for (const OpCost& c : costs_) {
      program.stats.flops_per_device += c.flops;
      program.stats.model_flops += c.model_flops;
      if (c.recomputed) program.stats.recomputed_flops += c.model_flops;
    }
    program.stats.op_costs = std::move(costs_);
    program.in_place = std::move(in_place_);
    program.in_place.insert(builder_.in_place().begin(), builder_.in_place().end());
    if (options_.fused_memory) MarkFusedAway(program);
    program.fused_away.insert(builder_.made_by_readers().begin(), builder_.made_by_readers().end());
    program.views.insert(builder_.views().begin(), builder_.views().end());
    int64_t peak_at = 0;
    program.stats.peak_bytes_per_device = PeakBytesPerDevice(program, &peak_at);
    program.stats.host_peak_bytes_per_device = PeakHostBytesPerDevice(program);
    if (!program.nodes.empty()) program.stats.peak_op = program.nodes[peak_at]->op()->qualified;
    return program;
  }

 private:
  const LocalValue& Local(const ir::Value& v) const { return locals_.at(v.node.get()).at(v.index); }

  // The layout a partial output `layout` is reduced to: its tiling, plus the tiling its
  // propagated sharding adds over the pending axes (a reduce-scatter instead of an all-reduce,
  // e.g. a gradient whose parameter is sharded on the axis its sum runs over).
  Sharding CompleteLayout(const ir::Value& out, const Sharding& layout) const {
    Sharding complete = layout.WithoutPartial();
    const Sharding& wanted = prop_.Get(out);
    if (!wanted.valid() || wanted.IsPartial() || wanted.mesh() != *mesh_ ||
        wanted.rank() != complete.rank())
      return complete;
    for (int64_t d = 0; d < complete.rank(); ++d) {
      const AxisList& have = complete.axes(d);
      const AxisList& want = wanted.axes(d);
      // Only extensions of the tiling by pending axes: anything else would move data.
      if (want.size() < have.size() || !std::equal(have.begin(), have.end(), want.begin()))
        return complete;
      for (size_t i = have.size(); i < want.size(); ++i)
        if (std::find(layout.partial_axes().begin(), layout.partial_axes().end(), want[i]) ==
            layout.partial_axes().end())
          return complete;
    }
    return wanted;
  }

  Sharding Layout(const Sharding& s, int64_t rank) const {
    return s.valid() ? s : Sharding::Replicated(mesh_, rank);
  }

  // A placeholder node for a parameter: the device data arrives in the layout it has (data on
  // another mesh is re-laid out on the host before the run).
  LocalValue Parameter(const ir::Node& n, Program& program) {
    const TensorType& global = n.output(0);
    const Sharding& have = LayoutOfData(n, options_.param_layouts);
    Sharding layout = have.valid() && have.mesh() == *mesh_ ? have
                                                            : Sharding::Replicated(mesh_, global.rank());
    TensorType local{global.dtype, LocalShape(global.shape, layout)};
    ir::NodePtr param =
        builder_.Emit(ir::InternalOps::Get().device_data, {}, {}, {local}, {layout});
    program.params.push_back(param);
    program.param_shardings.push_back(layout);
    return LocalValue{ir::Value{param, 0}, layout, global};
  }

  // A move between device and host memory (partition/offload.h), in the value's layout: a
  // transfer over the host link, recorded with the collectives (it runs beside the compute as
  // they do), each direction on a stream of its own (CollectiveStat::channel 3 and 4).
  LocalValue OverHostLink(const ir::Node& n) {
    const LocalValue& v = Local(n.input(0));
    const bool to_host = n.op() == ir::InternalOps::Get().place_to_host;
    ir::Value r = builder_.EmitInternal(n.op(), v.value, {}, v.value.type(), v.layout,
                                        to_host ? "device-to-host" : "host-to-device", {});
    builder_.collectives().back().channel = to_host ? 3 : 4;
    return LocalValue{r, v.layout, v.global};
  }

  // A constraint reshards to the user's layout; a manual one marks a value computed in a
  // manual region (it must be manual already).
  LocalValue Constrain(const ir::Node& n) {
    const Sharding want = OnMesh(n.shardings().at(0), mesh_, n.output(0).rank());
    const LocalValue& v = Local(n.input(0));
    if (!want.is_manual()) return Reshard(builder_, v, want);
    SPMD_CHECK_VALUE(v.layout.is_manual(),
                     "{manual} marks a value computed from manually sharded ones "
                     "(enable_manual_sharding); this one is laid out as ", v.layout.ToString());
    return v;
  }

  bool HasManualOperand(const ir::Node& n) const {
    for (const ir::Value& in : n.inputs())
      if (Local(in).layout.is_manual()) return true;
    return false;
  }

  // An op inside a manual region: every device runs it on its own buffers, whose shapes are
  // the op's shapes (PyTorch/XLA's manual sharding). Other operands must be replicated values.
  void LowerManual(const ir::Node& n) {
    std::vector<LocalValue> operands;
    std::vector<ir::Value> inputs;
    for (const ir::Value& in : n.inputs()) {
      LocalValue v = Local(in);
      if (!v.layout.is_manual()) v = Reshard(builder_, v, Sharding::Replicated(mesh_, in.type().rank()));
      inputs.push_back(v.value);
      operands.push_back(std::move(v));
    }
    std::vector<Sharding> layouts;
    for (int o = 0; o < n.num_outputs(); ++o)
      layouts.push_back(Sharding::Manual(mesh_, n.output(o).rank()));
    RecordCost(n, nullptr, {}, operands, layouts);
    ir::NodePtr local = builder_.Emit(n.op(), inputs, WithScalarSlots(n.args(), scalar_base_.at(&n)),
                                      n.outputs(), layouts);
    std::vector<LocalValue> results;
    for (int o = 0; o < n.num_outputs(); ++o)
      results.push_back(LocalValue{ir::Value{local, o}, layouts[o], n.output(o)});
    locals_[&n] = std::move(results);
  }

  // A node with a rule, lowered in phases: its factors assigned to mesh axes, its operands
  // resharded to what the assignment asks (or one of them gathered step by step, a windowed
  // einsum), its results' layouts, the local ops, and the fusion bookkeeping they feed.
  void LowerNode(const ir::Node& n) {
    const ShardingRule* rule = prop_.RuleOf(&n);
    if (!rule) return LowerReplicated(n);
    FactorAxes fa = AssignNodeFactors(n, *rule);
    const std::vector<int> passing = PartialPassingOperands(n, *rule, fa);
    std::optional<RingPlan> ring = passing.empty() ? PlanNodeRing(n, *rule, fa) : std::nullopt;
    if (ring && ring->exchange) {
      fa = ExchangedFactors(*rule, std::move(fa), *ring);
      ring.reset();
    }
    AxisList passed;  // partial-sum axes carried through the op into its results
    std::vector<LocalValue> operands;
    std::optional<WindowedEinsum> windowed;
    int64_t gathered_bytes = 0;  // what a windowed operand's (ring operand's) steps read besides its own tile
    for (size_t i = 0; i < n.inputs().size(); ++i) {
      Sharding want = Sharding::Tiled(mesh_, DimAxesFromFactors(*rule, *mesh_, rule->operands[i], fa));
      LocalValue v = Local(n.input(i));
      if (ring && IsRingOperand(*rule, i)) {  // read a tile at a time around the ring
        want = RingOperandLayout(*rule, static_cast<int>(i), want, *ring);
        operands.push_back(LocalOperand(n, *rule, fa, i, std::move(v), want, false, &passed));
        gathered_bytes += operands.back().value.type().bytes() * (AxesSize(*mesh_, ring->axes) - 1);
        continue;
      }
      if (!windowed && passing.empty())
        windowed = PlanWindowedGather(n, *rule, *mesh_, static_cast<int>(i), v.layout, want,
                                      Windowing(weights_.count(n.input(i).node.get()) > 0));
      if (windowed && windowed->operand == static_cast<int>(i)) {  // gathered step by step
        gathered_bytes = v.value.type().bytes() * (AxesSize(*mesh_, windowed->axes) - 1);
        operands.push_back(std::move(v));
        continue;
      }
      const bool passes = std::find(passing.begin(), passing.end(), static_cast<int>(i)) !=
                          passing.end();
      operands.push_back(LocalOperand(n, *rule, fa, i, std::move(v), want, passes, &passed));
    }
    std::vector<Sharding> result_layouts = ResultLayouts(n, *rule, fa, passed);
    if (!windowed && !ring && passed.empty() && n.num_outputs() == 1) {
      ir::Value out{graph_.nodes[graph_.PositionOf(&n)], 0};
      windowed = PlanWindowedScatter(n, *rule, *mesh_, result_layouts[0], prop_.Get(out),
                                     Windowing(false));
    }
    RecordCost(n, &*rule, fa, operands, result_layouts);
    costs_.back().bytes += gathered_bytes;
    const size_t first_node = builder_.nodes().size();
    LocalBuilder lb(builder_, n, *rule, fa, result_layouts, scalar_base_.at(&n));
    std::vector<LocalValue> results =
        ring ? rule->lowering.ring->lower(lb, operands, ring->axes)
             : EmitLocalOps(n, *rule, lb, windowed, operands, result_layouts);
    if (!lb.cost_steps().empty()) SplitCost(lb.cost_steps());
    NoteLoweredNodes(n, *rule, results, first_node);
    locals_[&n] = std::move(results);
  }

  // The mesh axes each factor of `n`'s rule is split over, from its operands' and results'
  // propagated shardings.
  FactorAxes AssignNodeFactors(const ir::Node& n, const ShardingRule& rule) const {
    std::vector<const Sharding*> operand_s, result_s;
    std::vector<TensorType> operand_t, result_t;
    for (const ir::Value& in : n.inputs()) {
      operand_s.push_back(&prop_.Get(in));
      operand_t.push_back(in.type());
    }
    for (int o = 0; o < n.num_outputs(); ++o) {
      ir::Value v{graph_.nodes[graph_.PositionOf(&n)], o};
      result_s.push_back(&prop_.Get(v));
      result_t.push_back(n.output(o));
    }
    FactorAxes fa = AssignFactors(rule, *mesh_, operand_s, operand_t, result_s, result_t);
    if (rule.lowering.results_must_replicate) fa.assign(fa.size(), AxisList());
    return fa;
  }

  // Whether `n` reads its rule's ring operands around a ring or by all-to-alls (ring.h).
  std::optional<RingPlan> PlanNodeRing(const ir::Node& n, const ShardingRule& rule,
                                       const FactorAxes& fa) {
    if (!rule.lowering.ring) return std::nullopt;
    std::vector<Sharding> have;
    for (const ir::Value& in : n.inputs()) have.push_back(Local(in).layout);
    return PlanRing(n, rule, mesh_, fa, have, options_.context_parallel);
  }

  static bool IsRingOperand(const ShardingRule& rule, size_t i) {
    const std::vector<int>& ring = rule.lowering.ring->operands;
    return std::find(ring.begin(), ring.end(), static_cast<int>(i)) != ring.end();
  }

  // Operand `i` of `n` (local value `v`) in the layout `want` the factor assignment asks for.
  // `passes`: a pending sum in it passes through the op (its axes go to `passed`).
  LocalValue LocalOperand(const ir::Node& n, const ShardingRule& rule, const FactorAxes& fa,
                          size_t i, LocalValue v, const Sharding& want, bool passes,
                          AxisList* passed) {
    bool shape_only = i < rule.shape_only_operands.size() && rule.shape_only_operands[i];
    if (shape_only && v.layout.IsPartial()) v.layout = v.layout.WithoutPartial();  // values unread
    const bool options_only = i < rule.options_only_operands.size() && rule.options_only_operands[i];
    if (options_only) {
      // (Its local buffer as it is: only its dtype and device are read.)
    } else if (passes) {
      // Linear in this operand: move the partial values like whole ones (every reshard step
      // is linear too) and keep the sum pending.
      *passed = v.layout.partial_axes();
      v.layout = v.layout.WithoutPartial();
      v = Reshard(builder_, v, want);
      v.layout = v.layout.WithPartial(*passed, ReduceOp::kSum);
    } else if (v.layout.IsPartial()) {
      // Reducing a pending sum finishes the op that produced it (a gradient's reduce-scatter
      // belongs to the backward of its layer, not to the optimizer update that reads it):
      // the collectives carry the producer's module path.
      builder_.set_scope(n.input(i).node->scope());
      v = Reshard(builder_, v, want);
      builder_.set_scope(n.scope());
    } else {
      v = Reshard(builder_, v, want);
    }
    // Padding read by a sharded reduction must hold the reduction's identity.
    for (size_t d = 0; d < rule.operands[i].size(); ++d)
      for (int f : rule.operands[i][d])
        if ((rule.factors[f].kind == FactorKind::kReduction || rule.factors[f].always_mask) &&
            !fa[f].empty())
          v = MaskPadding(builder_, v, {static_cast<int>(d)}, rule.factors[f].pad_value);
    return v;
  }

  // The layouts of `n`'s results: tiled as the factors are, partial over the axes a reduction
  // factor is split on and those of a sum passed through (`passed`).
  std::vector<Sharding> ResultLayouts(const ir::Node& n, const ShardingRule& rule,
                                      const FactorAxes& fa, const AxisList& passed) const {
    std::vector<Sharding> layouts;
    for (int o = 0; o < n.num_outputs(); ++o) {
      Sharding s = Sharding::Tiled(mesh_, DimAxesFromFactors(rule, *mesh_, rule.results[o], fa));
      ReduceOp op = ReduceOp::kSum;
      AxisList partial = PartialAxes(rule, fa, o, &op);
      if (!passed.empty()) {  // op is kSum here (checked by PartialPassingOperands)
        partial.insert(partial.end(), passed.begin(), passed.end());
        std::sort(partial.begin(), partial.end());
      }
      layouts.push_back(partial.empty() ? s : s.WithPartial(partial, op));
    }
    return layouts;
  }

  // The local ops of `n`: a windowed einsum's steps, the rule's own lowering, or the op itself
  // on local buffers (with the local arguments the rule gives, if any).
  std::vector<LocalValue> EmitLocalOps(const ir::Node& n, const ShardingRule& rule,
                                       LocalBuilder& lb,
                                       const std::optional<WindowedEinsum>& windowed,
                                       const std::vector<LocalValue>& operands,
                                       const std::vector<Sharding>& result_layouts) {
    std::vector<LocalValue> results;
    if (windowed) {
      results = LowerWindowedEinsum(lb, *windowed, operands, result_layouts[0]);
    } else if (rule.lowering.lower) {
      results = rule.lowering.lower(lb, operands);
    } else if (rule.lowering.local_args) {
      std::vector<Shape> local_shapes;
      for (int o = 0; o < n.num_outputs(); ++o)
        local_shapes.push_back(LocalShape(n.output(o).shape, result_layouts[o]));
      results = lb.EmitNodeOp(operands, lb.WithSlots(rule.lowering.local_args(n, local_shapes)));
    } else {
      results = lb.EmitNodeOp(operands);
    }
    SPMD_CHECK(static_cast<int>(results.size()) == n.num_outputs(), "internal error: lowering of ",
               n.op()->qualified, " produced ", results.size(), " results");
    return results;
  }

  // What the local nodes emitted for `n` from `first_node` on tell later passes: the in-place
  // update of an operand, and which of them fuse with their neighbours.
  void NoteLoweredNodes(const ir::Node& n, const ShardingRule& rule,
                        const std::vector<LocalValue>& results, size_t first_node) {
    if (!rule.cost.updates_operand.empty() && !results.empty() &&
        builder_.nodes().size() > first_node && results[0].value.node == builder_.nodes().back())
      in_place_[builder_.nodes().back().get()] = rule.cost.updates_operand;
    if (IsPointwise(rule) && rule.executor.view == ViewKind::kNone) NotePointwiseResults(n, results, first_node);
    // (Views too: a compiler folds them into the fusion around them, as XLA's bitcasts.)
    if (IsPointwise(rule) || rule.executor.view != ViewKind::kNone || rule.cost.fuses_into_reader)
      for (size_t k = first_node; k < builder_.nodes().size(); ++k)
        if (!builder_.nodes()[k]->op()->internal) fusible_.insert(builder_.nodes()[k].get());
  }

  // The values a compiling runtime never holds (PartitionOptions::fused_memory). A fusion is a
  // group of local ops ending at the one whose value is held; it holds at most one op that is
  // not elementwise (a matmul, a reduction: its "hero", as XLA's fusions have one), with the
  // elementwise ops (fusible_: pointwise, views, ShardingRule::fuses_into_reader) around it. A
  // value joins its one reader's fusion when it is elementwise, or when its reader is and that
  // fusion has no hero yet. Not an output, not a collective's.
  void MarkFusedAway(Program& program) const {
    std::unordered_map<const ir::Node*, int> readers;
    std::unordered_map<const ir::Node*, const ir::Node*> reader_of;
    for (const ir::NodePtr& n : program.nodes)
      for (const ir::Value& in : n->inputs()) {
        ++readers[in.node.get()];
        reader_of[in.node.get()] = n.get();
      }
    for (const ir::Value& out : program.outputs) readers[out.node.get()] += 2;
    std::unordered_map<const ir::Node*, const ir::Node*> fusion_of;  // node -> held root
    std::unordered_set<const ir::Node*> has_hero;                     // roots
    auto root = [&](const ir::Node* n) {
      auto it = fusion_of.find(n);
      return it == fusion_of.end() ? n : it->second;
    };
    for (auto it = program.nodes.rbegin(); it != program.nodes.rend(); ++it) {
      const ir::Node* n = it->get();
      if (n->op()->internal || n->is_data()) continue;
      const bool elementwise = fusible_.count(n) > 0;
      auto count = readers.find(n);
      const ir::Node* reader =
          n->num_outputs() == 1 && count != readers.end() && count->second == 1
              ? reader_of.at(n) : nullptr;
      const bool joins = reader && !reader->op()->internal &&
                         (elementwise || (fusible_.count(reader) && !has_hero.count(root(reader))));
      if (!joins) {  // held: a fusion of its own
        if (!elementwise) has_hero.insert(n);
        continue;
      }
      const ir::Node* r = root(reader);
      fusion_of[n] = r;
      if (!elementwise) has_hero.insert(r);
      program.fused_away.insert(n);
    }
    // An elementwise op writes its result over an operand of the same type that dies there,
    // as XLA's buffer assignment shares it (an optimizer's updates: no second copy).
    for (const ir::NodePtr& n : program.nodes) {
      if (!fusible_.count(n.get()) || program.fused_away.count(n.get()) ||
          program.in_place.count(n.get()))
        continue;
      std::vector<int> over(n->num_outputs(), -1);
      std::vector<bool> taken(n->inputs().size(), false);
      bool any = false;
      for (int o = 0; o < n->num_outputs(); ++o)
        for (size_t k = 0; k < n->inputs().size(); ++k)
          if (!taken[k] && n->input(k).type() == n->output(o)) {
            over[o] = static_cast<int>(k);
            taken[k] = any = true;
            break;
          }
      if (any) program.in_place[n.get()] = std::move(over);
    }
  }

  // Fusion bookkeeping: the local nodes a pointwise op's lowering emitted for its results
  // (those emitted at `first_node` or later; a lowering may also hand back an operand as is).
  void NotePointwiseResults(const ir::Node& n, const std::vector<LocalValue>& results,
                            size_t first_node) {
    const std::vector<ir::NodePtr>& emitted = builder_.nodes();
    for (const LocalValue& r : results)
      if (std::find(emitted.begin() + first_node, emitted.end(), r.value.node) != emitted.end())
        pointwise_results_[r.value.node.get()] = PointwiseResult{costs_.size() - 1, &n};
  }

  // A pointwise op reading a value that a pointwise op produced for it alone (its only reader
  // in the graph, read as produced: no collective or other op in between) runs fused with that
  // producer: the value's HBM round trip (the producer's write, this op's read) is not paid.
  void FuseWithProducers(const ir::Node& n, const std::vector<LocalValue>& operands, OpCost& c) {
    for (size_t i = 0; i < operands.size(); ++i) {
      const ir::Value& local = operands[i].value;
      auto it = pointwise_results_.find(local.node.get());
      if (it == pointwise_results_.end()) continue;
      // Read only here: both the value this op reads and the producer's result have this
      // single reader (a view in between may have handed the producer's buffer on as is).
      const ir::Value& in = n.input(i);
      if (UsesOf(in.node.get(), in.index) != 1 || UsesOf(it->second.global, local.index) != 1)
        continue;
      const int64_t bytes = local.type().bytes();
      c.fused_bytes += bytes;
      costs_[it->second.cost].fused_bytes += bytes;
    }
  }

  // The operands whose pending partial sums may pass through node `n` unreduced: the one
  // partial operand of an op linear in it (ShardingRule::linear_operands), or every operand of
  // an additive op when all hold sums over the same axes; empty otherwise.
  std::vector<int> PartialPassingOperands(const ir::Node& n, const ShardingRule& rule,
                                          const FactorAxes& fa) const {
    std::vector<int> found;
    size_t read = 0;  // operands whose values the op reads
    for (size_t i = 0; i < n.inputs().size(); ++i) {
      bool shape_only = i < rule.shape_only_operands.size() && rule.shape_only_operands[i];
      if (shape_only) continue;
      ++read;
      if (Local(n.input(i)).layout.IsPartial()) found.push_back(static_cast<int>(i));
    }
    if (found.empty()) return {};
    if (found.size() > 1) {
      // op(a1 + a2, b1 + b2) = op(a1, b1) + op(a2, b2) holds for sums of the operands only.
      if (!rule.algebra.additive || found.size() != read) return {};
      for (int i : found)
        if (Local(n.input(i)).layout.partial_axes() != Local(n.input(found[0])).layout.partial_axes())
          return {};
    } else if (static_cast<size_t>(found[0]) >= rule.algebra.linear_operands.size() ||
               !rule.algebra.linear_operands[found[0]]) {
      return {};
    }
    // Only along a single path: each operand read by this node alone and each result read by
    // one node or output only (graph outputs count as readers). Otherwise the sum would be
    // reduced once per path (or once here and again by the program reading an output, e.g. an
    // optimizer state) instead of once, shared through the reshard cache.
    for (int o = 0; o < n.num_outputs(); ++o)
      if (UsesOf(&n, o) > 1) return {};
    // Reducing the result must not move more bytes than reducing the partial operands (a
    // cat's result is as large as its operands together).
    int64_t operand_elems = 0, operand_bytes = 0;
    for (int i : found) {
      operand_elems += NumElements(n.input(i).type().shape);
      operand_bytes += n.input(i).type().bytes();
    }
    for (int i : found) {
      const ir::Value& in = n.input(i);
      if (UsesOf(in.node.get(), in.index) != 1) return {};
      const Sharding& layout = Local(in).layout;
      if (layout.partial_op() != ReduceOp::kSum) return {};
      for (const AxisList& axes : fa)
        for (int a : axes)
          for (int p : layout.partial_axes())
            if (a == p) return {};  // the op wants that axis for tiling: reduce first
      for (int o = 0; o < n.num_outputs(); ++o) {
        if (n.output(o).dtype == DType::kUndefined) continue;
        if (NumElements(n.output(o).shape) > operand_elems) return {};
        // A wider result (an exact upcast, bf16 -> f32) would make the reduction move more
        // bytes. Worth it only where this program does not reduce the sum at all: with deferred
        // output reductions, when it can stay pending up to an output (gradient accumulation
        // over micro-steps then reduces once, at the update, in the wider type). Otherwise it
        // is reduced here, in the operand's type.
        if (n.output(o).bytes() > operand_bytes &&
            !(options_.defer_output_reductions && MayStayPendingToOutput(&n, o)))
          return {};
        ReduceOp op = ReduceOp::kSum;
        if (!PartialAxes(rule, fa, o, &op).empty() && op != ReduceOp::kSum) return {};
      }
    }
    return found;
  }

  // The cost of global node `n` as each device runs it: FLOPs from its rule (none: run whole),
  // bytes of its local operands and results.
  void RecordCost(const ir::Node& n, const ShardingRule* rule, const FactorAxes& fa,
                  const std::vector<LocalValue>& operands, const std::vector<Sharding>& layouts) {
    std::vector<TensorType> local, global;
    OpCost c;
    c.op = n.op()->qualified;
    c.scope = ir::ScopeName(n.scope());
    c.position = static_cast<int64_t>(builder_.nodes().size());
    for (const LocalValue& v : operands) c.bytes += v.value.type().bytes();
    for (int o = 0; o < n.num_outputs(); ++o) {
      const TensorType& t = n.output(o);
      global.push_back(t);
      local.push_back(t.dtype == DType::kUndefined ? t
                                                   : TensorType{t.dtype, LocalShape(t.shape, layouts[o])});
      if (t.dtype != DType::kUndefined) c.bytes += local.back().bytes();
    }
    if (n.num_outputs() > 0) c.dtype = ComputeDType(n, rule);
    if (rule) SetRuleCost(c, *rule, *mesh_, fa, local);
    else c.flops = ElementFlops(local);
    c.model_flops = rule ? RuleFlops(*rule, *mesh_, FactorAxes(fa.size()), global) : ElementFlops(global);
    c.recomputed = !c.view && recomputed_.count(&n) > 0;  // a view computes nothing
    c.in_backward = n.in_backward();
    if (rule && IsPointwise(*rule) && rule->executor.view == ViewKind::kNone) FuseWithProducers(n, operands, c);
    costs_.push_back(std::move(c));
  }

  WindowedEinsumOptions Windowing(bool weight_operand) const {
    return WindowedEinsumOptions{options_.windowed_einsum_bytes,
                                 options_.windowed_einsum_min_extent, weight_operand};
  }

  // The op just lowered, whose lowering ran in steps (LocalBuilder::BeginCostStep), recorded
  // as one cost entry per step. The last one's end is set by the caller.
  void SplitCost(const std::vector<LocalBuilder::CostStep>& steps) {
    const OpCost whole = costs_.back();
    costs_.pop_back();
    for (size_t t = 0; t < steps.size(); ++t) {
      OpCost c = whole;
      const double share = steps[t].share;
      c.flops *= share;
      c.model_flops *= share;
      c.bytes = static_cast<int64_t>(static_cast<double>(whole.bytes) * share);
      c.fused_bytes = static_cast<int64_t>(static_cast<double>(whole.fused_bytes) * share);
      int64_t& extent = steps[t].gemm_extent == 'm'   ? c.gemm_m
                        : steps[t].gemm_extent == 'n' ? c.gemm_n
                                                      : c.gemm_k;
      extent = std::max<int64_t>(1, static_cast<int64_t>(static_cast<double>(extent) * share));
      if (share == 0) c.contraction = false;
      c.position = t == 0 ? whole.position : static_cast<int64_t>(steps[t].first_node);
      c.end_position = t + 1 < steps.size() ? static_cast<int64_t>(steps[t + 1].first_node)
                                            : whole.end_position;
      costs_.push_back(std::move(c));
    }
  }

  // Whether a pending sum in result `index` of `node` can stay pending up to a graph output:
  // that value, and each one after it, has a single reader, which passes sums in that operand
  // (linear in it, or additive) and has a single result, until the reader is the output. This
  // reads the graph only; each op on the way still decides when it is lowered (an additive op
  // whose other operand is complete reduces the sum there).
  bool MayStayPendingToOutput(const ir::Node* node, int index) const {
    while (UsesOf(node, index) == 1) {
      auto it = reader_.find({node, index});
      if (it == reader_.end()) return true;  // the one reader is a graph output
      const ir::Node* r = it->second;
      const ShardingRule* rule = prop_.RuleOf(r);
      if (!rule || r->num_outputs() != 1) return false;
      size_t i = 0;
      while (r->input(i).node.get() != node || r->input(i).index != index) ++i;
      if (!rule->algebra.additive && !(i < rule->algebra.linear_operands.size() && rule->algebra.linear_operands[i]))
        return false;
      node = r;
      index = 0;
    }
    return false;
  }

  int UsesOf(const ir::Node* node, int index) const {
    auto it = uses_.find({node, index});
    return it == uses_.end() ? 0 : it->second;
  }

  // No rule: gather every operand, run the op whole, and let consumers slice what they need.
  void LowerReplicated(const ir::Node& n) {
    bool gathered = false;
    std::vector<LocalValue> operands;
    for (const ir::Value& in : n.inputs()) {
      const LocalValue& v = Local(in);
      gathered |= v.layout.valid() && !v.layout.IsReplicated();
      operands.push_back(Reshard(builder_, v, Sharding::Replicated(mesh_, in.type().rank())));
    }
    if (gathered) fallbacks_[n.op()->qualified] += 1;
    std::vector<ir::Value> inputs;
    for (const LocalValue& v : operands) inputs.push_back(v.value);
    std::vector<Sharding> layouts;
    for (int o = 0; o < n.num_outputs(); ++o)
      layouts.push_back(Sharding::Replicated(mesh_, n.output(o).rank()));
    RecordCost(n, nullptr, {}, operands, layouts);
    ir::NodePtr local =
        builder_.Emit(n.op(), inputs, WithScalarSlots(n.args(), scalar_base_.at(&n)), n.outputs(), layouts);
    std::vector<LocalValue> results;
    for (int o = 0; o < n.num_outputs(); ++o)
      results.push_back(LocalValue{ir::Value{local, o}, layouts[o], n.output(o)});
    locals_[&n] = std::move(results);
  }

  const ir::Graph& graph_;
  MeshPtr mesh_;
  PartitionOptions options_;
  Propagation prop_;
  ProgramBuilder builder_;
  std::unordered_map<const ir::Node*, std::vector<LocalValue>> locals_;
  std::map<std::string, int64_t> fallbacks_;
  std::vector<OpCost> costs_;
  std::unordered_set<const ir::Node*> recomputed_;  // ir/recompute.h
  std::unordered_set<const ir::Node*> weights_;     // see the constructor
  std::unordered_set<const ir::Node*> fusible_;     // local pointwise ops (MarkFusedAway)
  std::unordered_map<const ir::Node*, std::vector<int>> in_place_;  // Program::in_place
  // Local nodes a pointwise op emitted for its results: that op's entry in costs_ and the
  // global node it lowers (whose results' readers decide whether they fuse).
  struct PointwiseResult {
    size_t cost;
    const ir::Node* global;
  };
  std::unordered_map<const ir::Node*, PointwiseResult> pointwise_results_;
  std::unordered_map<const ir::Node*, int32_t> scalar_base_;  // first scalar slot of each node
  std::map<std::pair<const ir::Node*, int>, int> uses_;  // readers of each value in the graph
  // A node reading each value (the only one where uses_ is 1 and the value is no graph output).
  std::map<std::pair<const ir::Node*, int>, const ir::Node*> reader_;
};

}  // namespace

Program PartitionGraph(const ir::Graph& graph, int64_t num_devices,
                       const PartitionOptions& options) {
  MeshPtr mesh = FindMesh(graph, options.param_layouts);
  if (!mesh) {
    std::vector<int64_t> ids(num_devices);
    for (int64_t i = 0; i < num_devices; ++i) ids[i] = i;
    mesh = std::make_shared<const Mesh>(ids, std::vector<int64_t>{num_devices});
  }
  const ir::Graph simplified = PlaceOffloaded(SimplifyGraph(graph));
  return Partitioner(simplified, mesh, options).Run();
}

}  // namespace spmd::partition
