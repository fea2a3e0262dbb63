#include "partition/rules/notation.h"

#include <functional>
#include <sstream>

namespace spmd::partition {

namespace {

std::string FactorName(int f) {
  if (f < 18) return std::string(1, static_cast<char>('i' + f));       // i .. z
  if (f < 26) return std::string(1, static_cast<char>('a' + f - 18));  // a .. h
  return "f" + std::to_string(f);
}

std::string Tensors(const std::vector<TensorFactors>& tensors) {
  std::ostringstream out;
  out << "(";
  for (size_t t = 0; t < tensors.size(); ++t) {
    out << (t ? ", [" : "[");
    for (size_t d = 0; d < tensors[t].size(); ++d) {
      if (d) out << ", ";
      if (tensors[t][d].empty()) out << "_";
      for (int f : tensors[t][d]) out << FactorName(f);
    }
    out << "]";
  }
  out << ")";
  return out.str();
}

// " name={a, b}" over the factors for which `pick` gives a non-empty label, or "".
std::string FactorSet(const ShardingRule& rule, const char* name,
                      const std::function<std::string(const Factor&, int)>& pick) {
  std::ostringstream out;
  bool any = false;
  for (size_t f = 0; f < rule.factors.size(); ++f) {
    std::string label = pick(rule.factors[f], static_cast<int>(f));
    if (label.empty()) continue;
    out << (any ? ", " : " " + std::string(name) + "={") << label;
    any = true;
  }
  if (any) out << "}";
  return out.str();
}

}  // namespace

std::string FactorNotation(const ShardingRule& rule) {
  std::ostringstream out;
  out << Tensors(rule.operands) << " -> " << Tensors(rule.results) << " {";
  for (size_t f = 0; f < rule.factors.size(); ++f)
    out << (f ? ", " : "") << FactorName(static_cast<int>(f)) << "=" << rule.factors[f].size;
  out << "}";
  out << FactorSet(rule, "reduction", [](const Factor& f, int i) -> std::string {
    if (f.kind != FactorKind::kReduction) return "";
    return FactorName(i) + (f.reduce == ReduceOp::kSum ? "" : "(" + ReduceOpName(f.reduce) + ")");
  });
  out << FactorSet(rule, "need_replication", [](const Factor& f, int i) {
    return f.kind == FactorKind::kNeedReplication ? FactorName(i) : std::string();
  });
  out << FactorSet(rule, "windowed", [](const Factor& f, int i) {
    return f.windowed ? FactorName(i) : std::string();
  });
  out << FactorSet(rule, "couples_tiles", [](const Factor& f, int i) {
    return f.couples_tiles ? FactorName(i) : std::string();
  });
  out << FactorSet(rule, "sums", [](const Factor& f, int i) {
    return f.sums ? FactorName(i) : std::string();
  });
  out << FactorSet(rule, "yields", [](const Factor& f, int i) {
    return f.priority < 0 ? FactorName(i) : std::string();
  });
  std::ostringstream linear;
  for (size_t o = 0; o < rule.algebra.linear_operands.size(); ++o)
    if (rule.algebra.linear_operands[o]) linear << (linear.tellp() > 0 ? ", " : "") << o;
  if (linear.tellp() > 0) out << " linear={" << linear.str() << "}";
  if (rule.algebra.additive) out << " additive";
  if (rule.executor.elementwise) out << " elementwise";
  if (rule.executor.reads_extents) out << " reads_extents";
  if (rule.executor.reads_strides) out << " reads_strides";
  static const char* const kViewNames[] = {"", "reshape", "permute", "subset", "other"};
  if (rule.executor.view != ViewKind::kNone) out << " view=" << kViewNames[static_cast<int>(rule.executor.view)];
  if (rule.lowering.results_must_replicate) out << " must_replicate";
  return out.str();
}

}  // namespace spmd::partition
