// Sharding propagation: from the user's annotations (device data layouts and sharding
// constraints) to a sharding for every value, through the ops' factor rules, forward and
// backward until nothing changes. User annotations are never overwritten; a value's sharding
// is only ever refined (axes added), which guarantees termination; conflicts go to the larger
// tensor (see AssignFactors).
#pragma once
#include <optional>
#include <unordered_map>
#include <vector>

#include "ir/graph.h"
#include "partition/rules/rule.h"

namespace spmd::partition {

// Per parameter, keyed by its data (ir::Node::data().get()): a layout to take its data to
// have instead of the data's own. How a search tries layouts without moving any data.
using ParamLayouts = std::unordered_map<const void*, Sharding>;

// The layout a data node's data has for partitioning: its entry in `overrides` (when given
// and present), else the data's own (invalid: not laid out, replicated).
const Sharding& LayoutOfData(const ir::Node& data_node, const ParamLayouts* overrides);

class Propagation {
 public:
  Propagation(const ir::Graph& graph, MeshPtr mesh, const ParamLayouts* overrides = nullptr);

  // The propagated sharding of a value (replicated when nothing reached it). Partial axes of
  // device data are kept: they describe the data as it is.
  const Sharding& Get(const ir::Value& v) const;
  // The rule of a node (nullptr when the op has none).
  const ShardingRule* RuleOf(const ir::Node* node) const;
  int iterations() const { return iterations_; }

 private:
  int Index(const ir::Value& v) const;
  bool Visit(size_t position);  // the node at `position`; whether any sharding changed

  const ir::Graph& graph_;
  MeshPtr mesh_;
  std::vector<int> first_value_;            // node position -> index of its output 0
  std::vector<Sharding> shardings_;         // per value; invalid = unknown
  std::vector<bool> frozen_;                // per value: a user annotation or device data
  std::vector<int> first_input_;            // node position -> its first in input_values_
  std::vector<int> input_values_;           // per input edge, the value index it reads
  std::vector<RulePtr> rules_;  // per node position
  // A visit is a function of its node's values' shardings: a node none of whose values
  // changed since its last visit began is skipped (the same answer again). changed_at_ (per
  // value) and visited_at_ (per node) are ticks of clock_.
  std::vector<int64_t> changed_at_;
  std::vector<int64_t> visited_at_;
  int64_t clock_ = 0;
  int iterations_ = 0;
};

// `s` on the step's mesh: an annotation made on another mesh of the step's devices that tiles
// nothing (no sharding, or every axis it names has size 1, as any axis of a one-device mesh) is
// the step mesh's replicated layout; any other sharding stays as it is.
Sharding OnMesh(const Sharding& s, const MeshPtr& mesh, int64_t rank);

// Whether `next` only adds axes to `current` (each dim's axes extend the old ones).
bool IsRefinement(const Sharding& current, const Sharding& next);

}  // namespace spmd::partition
