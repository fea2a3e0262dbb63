// Indexing by tensors: index_select, gather, scatter(_add/_reduce), index_add. The indexed dim
// is read or written at data-dependent positions, so it replicates; dims that line up between
// self, index and source pass through.
#include "partition/rules/all_rules.h"
#include "partition/rules/rule.h"

namespace spmd::partition {

namespace {

int64_t DimOf(const ir::Node& n, int64_t rank) {
  return WrapDim(IntArg(n, ArgIndex(n, "dim"), 0), std::max<int64_t>(rank, 1));
}

// index_select(self, dim, index [L]) -> self with dim of size L taken from index.
std::optional<ShardingRule> IndexSelect(const ir::Node& node) {
  const TensorType& self = node.input(0).type();
  const TensorType& index = node.input(1).type();
  if (self.rank() == 0 || index.rank() != 1) return std::nullopt;
  int64_t dim = DimOf(node, self.rank());
  ShardingRule rule;
  rule.executor.reads_extents = false;  // dims other than the indexed one are independent
  TensorFactors fs, fo;
  int picked = rule.AddFactor(index.shape[0]);
  // Index padding holds garbage the kernel would reject as out of range: read index 0 there.
  rule.factors[picked].always_mask = true;
  for (int64_t d = 0; d < self.rank(); ++d) {
    if (d == dim) {
      fs.push_back({rule.AddFactor(self.shape[d], FactorKind::kNeedReplication)});
      fo.push_back({picked});
      continue;
    }
    int f = rule.AddFactor(self.shape[d]);
    fs.push_back({f});
    fo.push_back({f});
  }
  rule.operands = {fs, {{picked}}};
  rule.results = {fo};
  return rule;
}

// gather(self, dim, index) -> shaped like index; scatter-like ops(self, dim, index, src) ->
// shaped like self. Dims of equal extent are shared; the indexed dim replicates in self.
std::optional<ShardingRule> IndexedByTensor(const ir::Node& node, bool gather) {
  const TensorType& self = node.input(0).type();
  int index_input = InputOfArg(node, "index");
  if (index_input < 0) return std::nullopt;
  const TensorType& index = node.input(index_input).type();
  if (self.rank() != index.rank() || self.rank() == 0) return std::nullopt;
  int64_t dim = DimOf(node, self.rank());
  ShardingRule rule;
  rule.executor.reads_extents = false;  // dims other than the indexed one are independent
  TensorFactors fs, fi;
  for (int64_t d = 0; d < self.rank(); ++d) {
    if (d != dim && self.shape[d] == index.shape[d]) {
      int f = rule.AddFactor(self.shape[d]);
      rule.factors[f].always_mask = true;  // index padding -> 0, a valid position
      fs.push_back({f});
      fi.push_back({f});
      continue;
    }
    fs.push_back({rule.AddFactor(self.shape[d], FactorKind::kNeedReplication)});
    fi.push_back({rule.AddFactor(index.shape[d], FactorKind::kNeedReplication)});
  }
  rule.operands.resize(node.inputs().size());
  for (size_t i = 0; i < node.inputs().size(); ++i) {
    const TensorType& t = node.input(i).type();
    if (static_cast<int>(i) == index_input) rule.operands[i] = fi;
    else if (i == 0) rule.operands[i] = fs;
    else if (t.shape == index.shape) rule.operands[i] = fi;  // scatter's src
    else rule.operands[i] = TensorFactors(t.rank());
  }
  rule.results = {gather ? fi : fs};
  return rule;
}

// index_add(self, dim, index [L], source, alpha): source's dim (length L) replicates too.
std::optional<ShardingRule> IndexAdd(const ir::Node& node) {
  const TensorType& self = node.input(0).type();
  if (node.inputs().size() < 3 || self.rank() == 0) return std::nullopt;
  const TensorType& source = node.input(2).type();
  if (source.rank() != self.rank()) return std::nullopt;
  int64_t dim = DimOf(node, self.rank());
  ShardingRule rule;
  rule.executor.reads_extents = false;  // dims other than the indexed one are independent
  TensorFactors fs, fsrc;
  for (int64_t d = 0; d < self.rank(); ++d) {
    if (d == dim) {
      fs.push_back({rule.AddFactor(self.shape[d], FactorKind::kNeedReplication)});
      fsrc.push_back({rule.AddFactor(source.shape[d], FactorKind::kNeedReplication)});
      continue;
    }
    int f = rule.AddFactor(self.shape[d]);
    fs.push_back({f});
    fsrc.push_back({f});
  }
  rule.operands = {fs, {{rule.AddFactor(node.input(1).type().shape.at(0), FactorKind::kNeedReplication)}}, fsrc};
  rule.results = {fs};
  return rule;
}

}  // namespace

void RegisterIndexRules() {
  RegisterRule("aten::index_select", IndexSelect);
  RegisterRule("aten::gather", [](const ir::Node& n) { return IndexedByTensor(n, true); });
  RegisterRules({"aten::scatter", "aten::scatter_add", "aten::scatter_reduce"},
                [](const ir::Node& n) { return IndexedByTensor(n, false); });
  RegisterRule("aten::index_add", IndexAdd);
}

}  // namespace spmd::partition
