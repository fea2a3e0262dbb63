#include "partition/ring.h"

#include <algorithm>

#include "partition/halo.h"

namespace spmd::partition {

namespace {

// Bytes of the local tile of `global` laid out as `layout`.
int64_t LocalBytes(const TensorType& global, const Sharding& layout) {
  return TensorType{global.dtype, LocalShape(global.shape, layout)}.bytes();
}

bool HasFactor(const TensorFactors& dims, int f) {
  for (const DimFactors& d : dims)
    if (std::find(d.begin(), d.end(), f) != d.end()) return true;
  return false;
}

// Whether the all-to-alls move fewer bytes per device than the ring: each value holding the
// paired or ring factor is exchanged once ((n - 1) / n of its tile), while the ring passes
// each ring operand's tile, and each result of the ring factor's running sum, n - 1 times.
bool ExchangeMovesLess(const ir::Node& n, const ShardingRule& rule, const MeshPtr& mesh,
                       const FactorAxes& fa, const std::vector<Sharding>& have, int64_t members) {
  const ShardingRule::Lowering::Ring& r = *rule.lowering.ring;
  double ring = 0, exchange = 0;
  for (size_t i = 0; i < rule.operands.size(); ++i) {
    const bool in_ring = std::find(r.operands.begin(), r.operands.end(), i) != r.operands.end();
    const int64_t bytes = LocalBytes(n.input(i).type(), have[i]);
    if (in_ring) ring += static_cast<double>(bytes) * (members - 1);
    if (in_ring || HasFactor(rule.operands[i], r.paired))
      exchange += static_cast<double>(bytes) * (members - 1) / members;
  }
  for (size_t o = 0; o < rule.results.size(); ++o) {
    const Sharding layout = Sharding::Tiled(mesh, DimAxesFromFactors(rule, *mesh, rule.results[o], fa));
    const int64_t bytes = LocalBytes(n.output(static_cast<int>(o)), layout);
    if (HasFactor(rule.results[o], r.factor)) ring += static_cast<double>(bytes) * members;
    if (HasFactor(rule.results[o], r.factor) || HasFactor(rule.results[o], r.paired))
      exchange += static_cast<double>(bytes) * (members - 1) / members;
  }
  return exchange < ring;
}

}  // namespace

std::optional<RingPlan> PlanRing(const ir::Node& n, const ShardingRule& rule, const MeshPtr& mesh,
                                 const FactorAxes& fa, const std::vector<Sharding>& have,
                                 ContextParallel method) {
  if (method == ContextParallel::kGather || !rule.lowering.ring) return std::nullopt;
  const ShardingRule::Lowering::Ring& r = *rule.lowering.ring;
  RingPlan plan;
  for (int i : r.operands) {
    if (i < 0 || i >= static_cast<int>(have.size())) return std::nullopt;
    const Sharding& h = have[i];
    if (!h.valid() || h.IsPartial() || h.is_manual()) return std::nullopt;
    const int d = DimOfFactor(rule.operands[i], r.factor);
    if (d < 0 || h.axes(d).empty()) return std::nullopt;
    if (plan.axes.empty()) plan.axes = h.axes(d);
    else if (h.axes(d) != plan.axes) return std::nullopt;
  }
  const int64_t members = AxesSize(*mesh, plan.axes);
  if (members < 2 || rule.factors[r.factor].size % members != 0 || fa[r.paired] != plan.axes)
    return std::nullopt;
  if (r.exchange >= 0 && method != ContextParallel::kRing) {
    const int64_t tiles = AxesSize(*mesh, fa[r.exchange]) * members;
    const bool divides = rule.factors[r.exchange].size % tiles == 0;
    plan.exchange = divides && (method == ContextParallel::kAllToAll ||
                                ExchangeMovesLess(n, rule, mesh, fa, have, members));
  }
  return plan;
}

FactorAxes ExchangedFactors(const ShardingRule& rule, FactorAxes fa, const RingPlan& plan) {
  const ShardingRule::Lowering::Ring& r = *rule.lowering.ring;
  fa[r.paired].clear();
  fa[r.exchange].insert(fa[r.exchange].end(), plan.axes.begin(), plan.axes.end());
  return fa;
}

Sharding RingOperandLayout(const ShardingRule& rule, int i, const Sharding& want,
                           const RingPlan& plan) {
  return want.WithDimAxes(DimOfFactor(rule.operands[i], rule.lowering.ring->factor), plan.axes);
}

LocalValue RingPermute(LocalBuilder& b, const LocalValue& v, const AxisList& axes, bool to_next) {
  const LocalValue r = RotateTiles(b, v, axes, to_next ? 1 : -1);
  b.program().collectives().back().channel = to_next ? 2 : 1;
  return r;
}

}  // namespace spmd::partition
