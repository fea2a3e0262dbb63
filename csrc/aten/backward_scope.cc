#include "aten/backward_scope.h"

#include <ATen/SequenceNumber.h>
#include <ATen/record_function.h>
#include <torch/csrc/autograd/function.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <utility>
#include <vector>

#include "ir/scope.h"

namespace spmd::aten {

namespace {

// Per forward thread: (first sequence number, scope) in increasing numbers. Bounded: the oldest
// half goes when it is full (a backward that old has long run: at ~60 scope changes a step this
// keeps about a thousand steps).
using Starts = std::vector<std::pair<uint64_t, ir::Scope>>;
constexpr size_t kMaxStarts = size_t{1} << 16;

struct History {
  std::mutex mu;
  std::unordered_map<uint64_t, Starts> by_thread;
};
History& Get() {
  static auto* history = new History();
  return *history;
}

// The scope of ops recorded while `node` runs: its forward scope's backward, nullopt when its
// forward was not noted (attribution off, or the node came from an untracked thread).
// AccumulateGrad nodes (numbered last, UINT64_MAX) have no forward op: they keep the scope of
// the backward node that ran before them on this thread.
thread_local std::optional<ir::Scope> t_last_backward;
std::optional<ir::Scope> ScopeOfNode(const torch::autograd::Node& node) {
  const uint64_t seq = node.sequence_nr();
  if (seq == std::numeric_limits<uint64_t>::max()) return t_last_backward;
  History& h = Get();
  std::lock_guard<std::mutex> lock(h.mu);
  auto thread = h.by_thread.find(node.thread_id());
  if (thread == h.by_thread.end()) return std::nullopt;
  const Starts& starts = thread->second;
  auto after = std::upper_bound(starts.begin(), starts.end(), seq,
                                [](uint64_t s, const auto& start) { return s < start.first; });
  if (after == starts.begin()) return std::nullopt;
  // Interned (once per node, see ResolveBackwardScope): equal names give the same scope.
  t_last_backward = ir::InternScope(ir::ScopeName(std::prev(after)->second) + " (backward)");
  return t_last_backward;
}

std::optional<ir::Scope> ResolveBackwardScope() {
  auto node = torch::autograd::get_current_node();  // set while autograd runs a node
  if (!node) return std::nullopt;
  // One node records several ops: resolve it once.
  thread_local const torch::autograd::Node* cached_node = nullptr;
  thread_local uint64_t cached_seq = 0;
  thread_local std::optional<ir::Scope> cached_scope;
  if (node.get() != cached_node || node->sequence_nr() != cached_seq) {
    cached_scope = ScopeOfNode(*node);
    cached_node = node.get();
    cached_seq = node->sequence_nr();
  }
  return cached_scope;
}

}  // namespace

void SetForwardScope(const std::string& name) {
  static const bool installed = (ir::SetBackwardScopeResolver(&ResolveBackwardScope), true);
  (void)installed;
  const ir::Scope scope = ir::InternScope(name);
  ir::SetCurrentScope(scope);
  const uint64_t next = at::sequence_number::peek();  // the next node this thread creates
  History& h = Get();
  std::lock_guard<std::mutex> lock(h.mu);
  Starts& starts = h.by_thread[at::RecordFunction::currentThreadId()];
  if (!starts.empty() && starts.back().first == next) {
    starts.back().second = scope;  // no node was created under the previous one
  } else if (starts.empty() || starts.back().second != scope) {
    starts.emplace_back(next, scope);
    if (starts.size() > kMaxStarts) starts.erase(starts.begin(), starts.begin() + kMaxStarts / 2);
  }
}

void ClearForwardScopes() {
  History& h = Get();
  std::lock_guard<std::mutex> lock(h.mu);
  h.by_thread.clear();
}

void InstallInBackwardResolver() {
  ir::SetInBackwardResolver([] { return torch::autograd::get_current_node() != nullptr; });
}

}  // namespace spmd::aten
