#include <algorithm>
#include <functional>
#include <mutex>
#include <stdexcept>
#include <unordered_map>

#include "partition/rules/all_rules.h"
#include "partition/rules/rule.h"

namespace spmd::partition {

namespace {
struct Registry {
  std::mutex mu;
  std::unordered_map<std::string, RuleBuilder> rules;
  struct PrefixRule {
    std::string prefix;
    RuleBuilder builder;
    std::vector<std::string> exclude;
  };
  std::vector<PrefixRule> prefix_rules;
};
Registry& GetRegistry() {
  static auto* r = new Registry();
  return *r;
}

// GetRule's memo: per hash of (op, args, input and output types), the nodes' fields it was
// built from and the rule.
struct RuleKey {
  const ir::OpInfo* op;
  std::vector<ir::Arg> args;
  std::vector<TensorType> inputs, outputs;
};
struct RuleMemo {
  std::mutex mu;
  std::unordered_multimap<Hash, std::pair<RuleKey, RulePtr>> entries;
};
RuleMemo& GetRuleMemo() {
  static auto* m = new RuleMemo();
  return *m;
}
constexpr size_t kRuleMemoEntries = 1 << 16;  // then it starts afresh

Hash RuleHash(const ir::Node& n) {
  Hash h = std::hash<const void*>()(n.op());
  for (const ir::Arg& a : n.args()) h = HashCombine(h, a.hash());
  for (const ir::Value& in : n.inputs())
    h = HashCombine(HashCombine(h, HashInt(static_cast<int64_t>(in.type().dtype))),
                    HashInts(in.type().shape));
  for (const TensorType& t : n.outputs())
    h = HashCombine(HashCombine(h, HashInt(static_cast<int64_t>(t.dtype))), HashInts(t.shape));
  return h;
}

// Equal but for the values of dynamic scalars: those are fed at run time (a program is reused
// with others, so no rule depends on them), and an optimizer's step count or learning rate
// would otherwise add an entry per step.
bool SameArg(const ir::Arg& a, const ir::Arg& b) {
  if (!a.dynamic || !b.dynamic) return a == b;
  return a.kind == b.kind && a.wrapped == b.wrapped &&
         (a.kind != ir::Arg::Kind::kScalarList || a.ints == b.ints);
}

bool Matches(const RuleKey& k, const ir::Node& n) {
  if (k.op != n.op() || k.outputs != n.outputs() || k.args.size() != n.args().size() ||
      k.inputs.size() != n.inputs().size())
    return false;
  for (size_t i = 0; i < k.args.size(); ++i)
    if (!SameArg(k.args[i], n.arg(i))) return false;
  for (size_t i = 0; i < k.inputs.size(); ++i)
    if (!(k.inputs[i] == n.input(i).type())) return false;
  return true;
}

void ForgetRules() {
  RuleMemo& m = GetRuleMemo();
  std::lock_guard<std::mutex> lock(m.mu);
  m.entries.clear();
}
}  // namespace

void RegisterRule(const std::string& op_name, RuleBuilder builder) {
  ForgetRules();  // (a node of this op may have been answered "no rule")
  Registry& r = GetRegistry();
  std::lock_guard<std::mutex> lock(r.mu);
  // One rule per name: a second registration is a mistake in a rule file (an op in two lists),
  // and which one would win depends on the order the families register in.
  if (!r.rules.emplace(op_name, std::move(builder)).second)
    throw std::logic_error("sharding rule registered twice for " + op_name);
}

void RegisterRules(const std::vector<std::string>& op_names, const RuleBuilder& builder) {
  for (const auto& name : op_names) RegisterRule(name, builder);
}

void RegisterRulePrefix(const std::string& prefix, RuleBuilder builder,
                        std::vector<std::string> exclude) {
  ForgetRules();
  Registry& r = GetRegistry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.prefix_rules.push_back({prefix, std::move(builder), std::move(exclude)});
}

namespace {
// Caller holds r.mu.
const RuleBuilder* FindLocked(Registry& r, const std::string& qualified, const std::string& name) {
  auto it = r.rules.find(qualified);
  if (it == r.rules.end()) it = r.rules.find(name);
  if (it != r.rules.end()) return &it->second;
  for (const Registry::PrefixRule& p : r.prefix_rules)
    if (name.compare(0, p.prefix.size(), p.prefix) == 0 &&
        std::find(p.exclude.begin(), p.exclude.end(), name) == p.exclude.end())
      return &p.builder;
  return nullptr;
}

const RuleBuilder* FindBuilder(const ir::OpInfo& op) {
  Registry& r = GetRegistry();
  std::lock_guard<std::mutex> lock(r.mu);
  return FindLocked(r, op.qualified, op.name);
}
}  // namespace

void RegisterAllRules() {
  static std::once_flag once;
  std::call_once(once, [] {
    RegisterPointwiseRules();
    RegisterReductionRules();
    RegisterMatmulRules();
    RegisterViewRules();
    RegisterNNRules();
    RegisterBatchNormRules();
    RegisterIndexRules();
    RegisterAdvancedIndexRules();
    RegisterConvRules();
    RegisterPoolRules();
    RegisterForeachRules();
    RegisterAttentionRules();
    RegisterGroupedMmRules();
    RegisterSoftmaxRules();
    RegisterShiftRules();
  });
}

RulePtr GetRule(const ir::Node& node) {
  RegisterAllRules();
  RuleMemo& memo = GetRuleMemo();
  const Hash h = RuleHash(node);
  {
    std::lock_guard<std::mutex> lock(memo.mu);
    auto [first, last] = memo.entries.equal_range(h);
    for (auto it = first; it != last; ++it)
      if (Matches(it->second.first, node)) return it->second.second;
  }
  const RuleBuilder* builder = FindBuilder(*node.op());
  std::optional<ShardingRule> rule = builder ? (*builder)(node) : std::nullopt;
  RulePtr shared = rule ? std::make_shared<const ShardingRule>(std::move(*rule)) : nullptr;
  RuleKey key{node.op(), node.args(), {}, node.outputs()};
  for (const ir::Value& in : node.inputs()) key.inputs.push_back(in.type());
  std::lock_guard<std::mutex> lock(memo.mu);
  if (memo.entries.size() >= kRuleMemoEntries) memo.entries.clear();
  memo.entries.emplace(h, std::make_pair(std::move(key), shared));
  return shared;
}

std::vector<std::string> RegisteredRuleNames() {
  RegisterAllRules();
  Registry& r = GetRegistry();
  std::lock_guard<std::mutex> lock(r.mu);
  std::vector<std::string> names;
  for (const auto& [name, builder] : r.rules) names.push_back(name);
  for (const Registry::PrefixRule& p : r.prefix_rules) names.push_back(p.prefix + "*");
  std::sort(names.begin(), names.end());
  return names;
}

bool HasRuleFor(const std::string& qualified_name) {
  RegisterAllRules();
  Registry& r = GetRegistry();
  std::lock_guard<std::mutex> lock(r.mu);
  return FindLocked(r, qualified_name, qualified_name.substr(0, qualified_name.find('.'))) != nullptr;
}

RuleBuilder LinearIn(RuleBuilder inner, std::vector<int> operands) {
  return [inner, operands](const ir::Node& node) -> std::optional<ShardingRule> {
    std::optional<ShardingRule> rule = inner(node);
    if (!rule) return rule;
    rule->algebra.linear_operands.assign(node.inputs().size(), false);
    for (int i : operands) {
      if (i < 0) rule->algebra.linear_operands.assign(node.inputs().size(), true);
      else if (i < static_cast<int>(node.inputs().size())) rule->algebra.linear_operands[i] = true;
    }
    return rule;
  };
}

namespace {

// `inner` with its rule amended by `amend`.
RuleBuilder Amended(RuleBuilder inner, std::function<void(ShardingRule&)> amend) {
  return [inner = std::move(inner), amend = std::move(amend)](const ir::Node& node) {
    std::optional<ShardingRule> rule = inner(node);
    if (rule) amend(*rule);
    return rule;
  };
}

}  // namespace

RuleBuilder AsView(RuleBuilder inner, ViewKind kind) {
  return Amended(std::move(inner), [kind](ShardingRule& r) { r.executor.view = kind; });
}
RuleBuilder WithForm(RuleBuilder inner, ShardingRule::Algebra::Form form) {
  return Amended(std::move(inner), [form](ShardingRule& r) { r.algebra.form = form; });
}
RuleBuilder Additive(RuleBuilder inner) {
  return Amended(std::move(inner), [](ShardingRule& r) { r.algebra.additive = true; });
}
RuleBuilder Joins(RuleBuilder inner) {
  return Amended(std::move(inner), [](ShardingRule& r) { r.algebra.joins = true; });
}
RuleBuilder ReadsNoExtents(RuleBuilder inner) {
  return Amended(std::move(inner), [](ShardingRule& r) { r.executor.reads_extents = false; });
}
RuleBuilder ReadsStrides(RuleBuilder inner) {
  return Amended(std::move(inner), [](ShardingRule& r) { r.executor.reads_strides = true; });
}

TensorFactors PassThroughFactors(ShardingRule& rule, const TensorType& type) {
  TensorFactors tf;
  for (int64_t size : type.shape) tf.push_back({rule.AddFactor(size)});
  return tf;
}

TensorFactors BroadcastFactors(const TensorType& type, const TensorType& result,
                               const TensorFactors& result_factors) {
  TensorFactors tf(type.shape.size());
  int64_t offset = result.rank() - type.rank();
  for (int64_t d = 0; d < type.rank(); ++d) {
    int64_t rd = d + offset;
    if (rd < 0) continue;
    if (type.shape[d] == result.shape[rd]) tf[d] = result_factors[rd];
  }
  return tf;
}

std::function<std::vector<ir::Arg>(const ir::Node&, const std::vector<Shape>&)> LocalSizeArgs(
    int size_index, int stride_index) {
  return [size_index, stride_index](const ir::Node& n, const std::vector<Shape>& local) {
    std::vector<ir::Arg> args = n.args();
    args[size_index] = ir::Arg::IntList(local[0]);
    if (stride_index >= 0) {
      std::vector<int64_t> stride(local[0].size(), 1);
      for (int64_t d = static_cast<int64_t>(stride.size()) - 2; d >= 0; --d)
        stride[d] = stride[d + 1] * std::max<int64_t>(local[0][d + 1], 1);
      args[stride_index] = ir::Arg::IntList(stride);
    }
    return args;
  };
}

std::vector<int64_t> IntListArg(const ir::Node& node, int index) {
  if (index < 0 || index >= static_cast<int>(node.args().size())) return {};
  const ir::Arg& a = node.arg(index);
  if (a.kind == ir::Arg::Kind::kIntList) return a.ints;
  if (a.kind == ir::Arg::Kind::kInt) return {a.i};
  return {};
}

int64_t IntArg(const ir::Node& node, int index, int64_t default_value) {
  if (index < 0 || index >= static_cast<int>(node.args().size())) return default_value;
  const ir::Arg& a = node.arg(index);
  return a.kind == ir::Arg::Kind::kInt || a.kind == ir::Arg::Kind::kScalarInt ? a.i : default_value;
}

bool BoolArg(const ir::Node& node, int index, bool default_value) {
  if (index < 0 || index >= static_cast<int>(node.args().size())) return default_value;
  const ir::Arg& a = node.arg(index);
  return a.kind == ir::Arg::Kind::kBool ? a.i != 0 : default_value;
}

int ArgIndex(const ir::Node& node, const char* name) { return node.op()->ArgIndex(name); }

int InputOfArg(const ir::Node& node, const char* name) {
  int a = ArgIndex(node, name);
  if (a < 0 || node.arg(a).kind != ir::Arg::Kind::kTensor) return -1;
  return static_cast<int>(node.arg(a).i);
}

}  // namespace spmd::partition
