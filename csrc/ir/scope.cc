#include "ir/scope.h"

#include <atomic>
#include <mutex>
#include <unordered_set>

namespace spmd::ir {

namespace {
std::atomic<Scope> g_current{nullptr};
}

Scope InternScope(const std::string& name) {
  if (name.empty()) return nullptr;
  static std::mutex mu;
  static auto* names = new std::unordered_set<std::string>();
  std::lock_guard<std::mutex> lock(mu);
  return &*names->insert(name).first;
}

// Process-wide, not per thread: autograd records the backward on its own thread, and the
// tracker sets the scope from the hooks that run there.
Scope CurrentScope() { return g_current.load(std::memory_order_relaxed); }
void SetCurrentScope(Scope scope) { g_current.store(scope, std::memory_order_relaxed); }

}  // namespace spmd::ir
