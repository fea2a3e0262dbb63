#include "aten/op_plan.h"

#include <ATen/core/jit_type.h>

#include <memory>

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
      return ir::ArgType::kOther;
    }
    default: return ir::ArgType::kOther;
  }
}

std::unique_ptr<OpPlan> BuildPlan(const c10::OperatorHandle& op) {
  auto plan = std::make_unique<OpPlan>();
  plan->handle = new c10::OperatorHandle(op);
  const c10::FunctionSchema& schema = op.schema();
  std::string qualified = schema.name();
  if (!schema.overload_name().empty()) qualified += "." + schema.overload_name();

  std::vector<ir::ArgSchema> args;
  for (const c10::Argument& a : schema.arguments()) {
    ir::ArgSchema as;
    as.name = a.name();
    as.type = ClassifyArg(a.real_type(), &as.optional);
    as.is_write = a.alias_info() && a.alias_info()->isWrite();
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
  plan->info = ir::InternOp(qualified, std::move(args), static_cast<int>(schema.returns().size()));
  plan->special = FindSpecialKernel(qualified);

  if (const ShapeFn* fn = FindCustomShapeFn(qualified)) {
    plan->custom_shape = *fn;
  } else if (!op.hasComputedKernelForDispatchKey(c10::DispatchKey::Meta)) {
    plan->eager_only = true;
    plan->eager_reason = "no meta kernel";
  } else {
    // Meta kernels registered from Python (torch/_meta_registrations.py) cost ~50 us a call.
    std::string table = op.dumpComputedTable();
    auto pos = table.find("\nMeta: ");
    if (pos == std::string::npos && table.rfind("Meta: ", 0) == 0) pos = 0;
    if (pos != std::string::npos) {
      auto end = table.find('\n', pos + 1);
      plan->cache_shapes = table.substr(pos, end - pos).find("/dev/null") != std::string::npos;
    }
  }
  return plan;
}

}  // namespace

OpPlan& GetOpPlan(const c10::OperatorHandle& op) {
  static std::mutex mu;
  static auto* plans = new std::unordered_map<const c10::FunctionSchema*, std::unique_ptr<OpPlan>>();
  const c10::FunctionSchema* key = &op.schema();
  std::lock_guard<std::mutex> lock(mu);
  auto it = plans->find(key);
  if (it != plans->end()) return *it->second;
  return *plans->emplace(key, BuildPlan(op)).first->second;
}

}  // namespace spmd::aten
