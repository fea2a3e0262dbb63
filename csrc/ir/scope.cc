#include "ir/scope.h"

#include <atomic>
#include <mutex>
#include <unordered_set>

namespace spmd::ir {

namespace {
std::atomic<Scope> g_current{nullptr};
std::atomic<BackwardScopeResolver> g_backward{nullptr};
std::atomic<InBackwardResolver> g_in_backward{nullptr};
}

Scope InternScope(const std::string& name) {
  if (name.empty()) return nullptr;
  static std::mutex mu;
  static auto* names = new std::unordered_set<std::string>();
  std::lock_guard<std::mutex> lock(mu);
  return &*names->insert(name).first;
}

// Process-wide, not per thread: the tracker's module hooks set it on whichever thread runs the
// forward. The backward (on autograd's threads) is resolved per node instead.
Scope CurrentScope() {
  if (BackwardScopeResolver resolve = g_backward.load(std::memory_order_relaxed))
    if (std::optional<Scope> scope = resolve()) return *scope;
  return g_current.load(std::memory_order_relaxed);
}
void SetCurrentScope(Scope scope) { g_current.store(scope, std::memory_order_relaxed); }
void SetBackwardScopeResolver(BackwardScopeResolver resolver) {
  g_backward.store(resolver, std::memory_order_relaxed);
}

void SetInBackwardResolver(InBackwardResolver resolver) {
  g_in_backward.store(resolver, std::memory_order_relaxed);
}
bool InBackward() {
  InBackwardResolver resolve = g_in_backward.load(std::memory_order_relaxed);
  return resolve && resolve();
}

}  // namespace spmd::ir
