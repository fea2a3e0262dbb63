#include "plan/dim_classes.h"

#include <numeric>
#include <unordered_map>

#include "ir/internal_ops.h"
#include "partition/rules/rule.h"

namespace spmd::plan {

using partition::GetRule;
using partition::Factor;
using partition::FactorKind;
using partition::TensorFactors;
using partition::RulePtr;
namespace {

class UnionFind {
 public:
  int Add() {
    parent_.push_back(static_cast<int>(parent_.size()));
    return parent_.back();
  }
  int Find(int x) {
    while (parent_[x] != x) x = parent_[x] = parent_[parent_[x]];
    return x;
  }
  void Join(int a, int b) { parent_[Find(a)] = Find(b); }

 private:
  std::vector<int> parent_;
};

}  // namespace

DimClasses ComputeDimClasses(const ir::Graph& graph) {
  UnionFind sets;
  DimClasses out;
  // first[node] + output index -> first set of that value's dims (a rank-0 value gets the
  // next value's start: it has no dim to look up)
  std::unordered_map<const ir::Node*, std::vector<int>>& first = out.first_element;
  int elements = 0;
  for (const ir::NodePtr& n : graph.nodes) {
    std::vector<int>& f = first[n.get()];
    for (int o = 0; o < n->num_outputs(); ++o) {
      f.push_back(elements);
      for (int64_t d = 0; d < n->output(o).rank(); ++d, ++elements) sets.Add();
    }
  }
  auto dim_set = [&](const ir::Value& v, int64_t d) { return first.at(v.node.get())[v.index] + d; };
  const auto& ops = ir::InternalOps::Get();
  for (const ir::NodePtr& n : graph.nodes) {
    if (n->is_data()) continue;
    if (n->op() == ops.sharding_constraint) {
      for (int64_t d = 0; d < n->output(0).rank(); ++d)
        sets.Join(dim_set(n->input(0), d), dim_set(ir::Value{n, 0}, d));
      continue;
    }
    RulePtr rule = GetRule(*n);
    if (!rule) continue;
    std::vector<int> of_factor(rule->factors.size(), -1);  // a set holding the factor
    auto tie = [&](const TensorFactors& dims, const ir::Value& v) {
      for (size_t d = 0; d < dims.size() && static_cast<int64_t>(d) < v.type().rank(); ++d) {
        if (dims[d].empty()) continue;
        const int f = dims[d].front();  // the major factor decides how the dim can tile
        const Factor& factor = rule->factors[f];
        if (factor.size <= 1 || factor.kind == FactorKind::kNeedReplication) continue;
        const int s = dim_set(v, static_cast<int64_t>(d));
        if (of_factor[f] < 0) of_factor[f] = s;
        else sets.Join(s, of_factor[f]);
      }
    };
    for (size_t i = 0; i < rule->operands.size() && i < n->inputs().size(); ++i)
      tie(rule->operands[i], n->input(i));
    for (size_t o = 0; o < rule->results.size() && static_cast<int>(o) < n->num_outputs(); ++o)
      tie(rule->results[o], ir::Value{n, static_cast<int>(o)});
  }
  // Number the classes that parameters touch, in parameter order.
  std::unordered_map<int, int> number;
  for (const ir::NodePtr& p : graph.params) {
    std::vector<int>& dims = out.param_dims.emplace_back();
    for (int64_t d = 0; d < p->output(0).rank(); ++d) {
      if (p->output(0).shape[d] <= 1) {
        dims.push_back(-1);
        continue;
      }
      auto [it, added] = number.emplace(sets.Find(dim_set(ir::Value{p, 0}, d)), out.num_classes);
      if (added) ++out.num_classes;
      dims.push_back(it->second);
    }
  }
  out.element_class.resize(elements);
  for (int e = 0; e < elements; ++e) {
    auto it = number.find(sets.Find(e));
    out.element_class[e] = it == number.end() ? -1 : it->second;
  }
  return out;
}

}  // namespace spmd::plan
