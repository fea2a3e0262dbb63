#include "aten/op_plan.h"

#include <ATen/core/jit_type.h>

#include <algorithm>
#include <memory>

#include "aten/named_ops.h"

namespace spmd::aten {

namespace {

ir::ArgType ClassifyArg(const c10::TypePtr& real_type, bool* optional) {
  c10::TypePtr t = real_type;
  *optional = false;
  if (auto opt = t->cast<c10::OptionalType>()) {
    *optional = true;
    t = opt->getElementType();
  }
  using K = c10::TypeKind;
  switch (t->kind()) {
    case K::TensorType: return ir::ArgType::kTensor;
    case K::IntType: case K::SymIntType: return ir::ArgType::kInt;
    case K::FloatType: return ir::ArgType::kFloat;
    case K::BoolType: return ir::ArgType::kBool;
    case K::StringType: return ir::ArgType::kString;
    case K::NumberType: return ir::ArgType::kScalar;
    case K::ScalarTypeType: return ir::ArgType::kScalarType;
    case K::LayoutType: return ir::ArgType::kLayout;
    case K::DeviceObjType: return ir::ArgType::kDevice;
    case K::MemoryFormatType: return ir::ArgType::kMemoryFormat;
    case K::GeneratorType: return ir::ArgType::kGenerator;
    case K::ListType: {
      c10::TypePtr e = t->castRaw<c10::ListType>()->getElementType();
      if (e->kind() == K::TensorType) return ir::ArgType::kTensorList;
      if (auto eo = e->cast<c10::OptionalType>())
        if (eo->getElementType()->kind() == K::TensorType) return ir::ArgType::kOptionalTensorList;
      if (e->kind() == K::IntType || e->kind() == K::SymIntType) return ir::ArgType::kIntList;
      if (e->kind() == K::FloatType) return ir::ArgType::kFloatList;
      if (e->kind() == K::BoolType) return ir::ArgType::kBoolList;
      if (e->kind() == K::NumberType) return ir::ArgType::kScalarList;
      return ir::ArgType::kOther;
    }
    default: return ir::ArgType::kOther;
  }
}

// Whether `schema` is a view op: its first return aliases its first argument without writing.
bool IsViewSchema(const c10::FunctionSchema& schema) {
  if (schema.arguments().empty() || schema.returns().empty()) return false;
  const auto& in = schema.arguments()[0].alias_info();
  const auto& out = schema.returns()[0].alias_info();
  return in && out && !in->isWrite() && !out->isWrite();
}

// The view op behind `schema`: itself if it is a view, or `aten::X[.overload]` for a functional
// view copy `aten::X_copy[.overload]` (what functionalization records instead of X).
const c10::OperatorHandle* FindViewOp(const c10::FunctionSchema& schema) {
  auto& dispatcher = c10::Dispatcher::singleton();
  const std::string& name = schema.name();
  c10::optional<c10::OperatorHandle> view;
  if (IsViewSchema(schema)) {
    view = dispatcher.findOp(c10::OperatorName(name, schema.overload_name()));
  } else if (name.size() > 5 && name.compare(name.size() - 5, 5, "_copy") == 0 &&
             !NamedOpSays(name, &NamedOp::not_a_view_copy)) {
    auto op = dispatcher.findOp(
        c10::OperatorName(name.substr(0, name.size() - 5), schema.overload_name()));
    if (op && op->hasSchema() && IsViewSchema(op->schema())) view = *op;
  }
  if (!view || !view->hasComputedKernelForDispatchKey(c10::DispatchKey::Meta)) return nullptr;
  return new c10::OperatorHandle(*view);  // lives as long as the plan
}

std::unique_ptr<OpPlan> BuildPlan(const c10::OperatorHandle& op) {
  auto plan = std::make_unique<OpPlan>();
  plan->handle = new c10::OperatorHandle(op);
  const c10::FunctionSchema& schema = op.schema();
  std::string qualified = schema.name();
  if (!schema.overload_name().empty()) qualified += "." + schema.overload_name();

  std::vector<ir::ArgSchema> args;
  const NamedOp* named = FindNamedOp(qualified);
  // (Arguments that CPU kernels write although the schema does not say so: without this the
  // update is lost, functionalization seeing a pure op, and replay would write into an
  // immutable device buffer.)
  const std::vector<int>* hidden = named ? &named->hidden_writes : nullptr;
  for (const c10::Argument& a : schema.arguments()) {
    ir::ArgSchema as;
    as.name = a.name();
    as.type = ClassifyArg(a.real_type(), &as.optional);
    as.is_write = a.alias_info() && a.alias_info()->isWrite();
    if (hidden && std::count(hidden->begin(), hidden->end(), static_cast<int>(args.size())))
      as.is_write = true;
    if (as.type == ir::ArgType::kOther) {
      plan->eager_only = true;
      plan->eager_reason = "argument type not recordable";
    }
    args.push_back(std::move(as));
  }
  for (const c10::Argument& r : schema.returns()) {
    bool opt = false;
    ir::ArgType t = ClassifyArg(r.real_type(), &opt);
    ReturnKind kind = t == ir::ArgType::kTensor       ? ReturnKind::kTensor
                      : t == ir::ArgType::kTensorList ? ReturnKind::kTensorList
                                                      : ReturnKind::kOther;
    if (kind == ReturnKind::kOther) {
      plan->eager_only = true;
      plan->eager_reason = "returns a non-tensor value";
    }
    plan->returns.push_back(kind);
    int alias = -1;
    if (r.alias_info() && r.alias_info()->isWrite()) {
      for (size_t i = 0; i < schema.arguments().size(); ++i) {
        const auto& ai = schema.arguments()[i].alias_info();
        if (ai && ai->isWrite() && ai->beforeSets() == r.alias_info()->beforeSets())
          alias = static_cast<int>(i);
      }
    }
    plan->return_alias.push_back(alias);
  }
  for (size_t i = 0; i < args.size(); ++i) {
    bool returned = std::count(plan->return_alias.begin(), plan->return_alias.end(),
                               static_cast<int>(i)) > 0;
    if (args[i].is_write && args[i].type == ir::ArgType::kTensor && !returned)
      plan->written_args.push_back(static_cast<int>(i));
  }
  bool has_generator = std::any_of(args.begin(), args.end(), [](const ir::ArgSchema& a) {
    return a.type == ir::ArgType::kGenerator;
  });
  plan->reseed_default_generator =
      !has_generator && op.hasTag(at::Tag::nondeterministic_seeded);
  plan->info = ir::InternOp(qualified, std::move(args), static_cast<int>(schema.returns().size()));
  plan->special = named ? named->special : nullptr;
  plan->view_op = FindViewOp(schema);

  bool has_meta = op.hasComputedKernelForDispatchKey(c10::DispatchKey::Meta);
  if (named && named->shape) {
    plan->custom_shape = named->shape;
  } else if (!has_meta) {
    plan->eager_only = true;
    plan->eager_reason = "no meta kernel";
  }
  return plan;
}

}  // namespace

OpPlan& GetOpPlan(const c10::OperatorHandle& op) {
  const c10::FunctionSchema* key = &op.schema();
  // Plans live forever, so each thread can remember the ones it saw without locking (this runs
  // once per recorded op).
  thread_local std::unordered_map<const c10::FunctionSchema*, OpPlan*> seen;
  auto hit = seen.find(key);
  if (hit != seen.end()) return *hit->second;
  static std::mutex mu;
  static auto* plans = new std::unordered_map<const c10::FunctionSchema*, std::unique_ptr<OpPlan>>();
  std::lock_guard<std::mutex> lock(mu);
  auto it = plans->find(key);
  if (it == plans->end()) it = plans->emplace(key, BuildPlan(op)).first;
  seen.emplace(key, it->second.get());
  return *it->second;
}

}  // namespace spmd::aten
