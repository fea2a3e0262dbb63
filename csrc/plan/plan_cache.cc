#include "plan/plan_cache.h"

#include <algorithm>

namespace spmd::plan {

PlanCache& PlanCache::Get() {
  static auto* cache = new PlanCache();
  return *cache;
}

std::shared_ptr<const partition::Program> PlanCache::Lookup(Hash key) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = std::find_if(entries_.begin(), entries_.end(),
                         [&](const auto& e) { return e.first == key; });
  if (it == entries_.end()) return nullptr;
  entries_.splice(entries_.begin(), entries_, it);
  return it->second;
}

void PlanCache::MakeRoom(size_t nodes) {
  std::lock_guard<std::mutex> lock(mu_);
  DropWhileFull(nodes);
}

void PlanCache::Insert(Hash key, std::shared_ptr<const partition::Program> program) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = std::find_if(entries_.begin(), entries_.end(),
                         [&](const auto& e) { return e.first == key; });
  if (it != entries_.end()) {
    nodes_ -= it->second->nodes.size();
    entries_.erase(it);
  }
  nodes_ += program->nodes.size();
  entries_.emplace_front(key, std::move(program));
}

size_t PlanCache::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return entries_.size();
}

void PlanCache::DropWhileFull(size_t incoming_nodes) {
  while (!entries_.empty() &&
         (entries_.size() >= max_entries_ || nodes_ + incoming_nodes > max_nodes_)) {
    nodes_ -= entries_.back().second->nodes.size();
    entries_.pop_back();
  }
}

}  // namespace spmd::plan
