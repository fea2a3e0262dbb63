#include "ir/op.h"

#include <memory>
#include <mutex>
#include <unordered_map>

namespace spmd::ir {

int OpInfo::ArgIndex(const std::string& arg_name) const {
  for (size_t i = 0; i < args.size(); ++i)
    if (args[i].name == arg_name) return static_cast<int>(i);
  return -1;
}

namespace {
struct Registry {
  std::mutex mu;
  std::unordered_map<std::string, std::unique_ptr<OpInfo>> ops;
};
Registry& GetRegistry() {
  static Registry* r = new Registry();
  return *r;
}
}  // namespace

const OpInfo* InternOp(const std::string& qualified, std::vector<ArgSchema> args,
                       int num_returns, bool internal) {
  Registry& r = GetRegistry();
  std::lock_guard<std::mutex> lock(r.mu);
  auto it = r.ops.find(qualified);
  if (it != r.ops.end()) return it->second.get();
  auto op = std::make_unique<OpInfo>();
  op->qualified = qualified;
  auto dot = qualified.find('.');
  op->name = qualified.substr(0, dot);
  op->overload = dot == std::string::npos ? "" : qualified.substr(dot + 1);
  for (const auto& a : args) op->has_mutable_arg |= a.is_write;
  op->args = std::move(args);
  op->num_returns = num_returns;
  op->internal = internal;
  const OpInfo* ptr = op.get();
  r.ops.emplace(qualified, std::move(op));
  return ptr;
}

const OpInfo* FindOp(const std::string& qualified) {
  Registry& r = GetRegistry();
  std::lock_guard<std::mutex> lock(r.mu);
  auto it = r.ops.find(qualified);
  return it == r.ops.end() ? nullptr : it->second.get();
}

}  // namespace spmd::ir
