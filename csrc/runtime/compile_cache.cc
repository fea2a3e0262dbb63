#include "runtime/compile_cache.h"

namespace spmd::runtime {

CompileCache& CompileCache::Get() {
  static auto* cache = new CompileCache();
  return *cache;
}

std::shared_ptr<Executable> CompileCache::Lookup(Hash key) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = map_.find(key);
  if (it == map_.end()) return nullptr;
  lru_.splice(lru_.begin(), lru_, it->second.second);
  return it->second.first;
}

void CompileCache::Insert(Hash key, std::shared_ptr<Executable> exe) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = map_.find(key);
  if (it != map_.end()) {
    it->second.first = std::move(exe);
    return;
  }
  lru_.push_front(key);
  map_.emplace(key, std::make_pair(std::move(exe), lru_.begin()));
  while (map_.size() > kCapacity) {
    map_.erase(lru_.back());
    lru_.pop_back();
  }
}

void CompileCache::Clear() {
  std::lock_guard<std::mutex> lock(mu_);
  map_.clear();
  lru_.clear();
}

size_t CompileCache::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return map_.size();
}

}  // namespace spmd::runtime
