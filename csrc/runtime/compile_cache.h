// Compiled programs by graph key. A steady training step hits the cache from its second
// iteration on; the size is bounded so pathological programs cannot grow memory forever.
#pragma once
#include <list>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "core/hash.h"
#include "runtime/executable.h"

namespace spmd::runtime {

class CompileCache {
 public:
  static CompileCache& Get();
  std::shared_ptr<Executable> Lookup(Hash key);
  void Insert(Hash key, std::shared_ptr<Executable> exe);
  void Clear();
  size_t size() const;

 private:
  static constexpr size_t kCapacity = 256;
  mutable std::mutex mu_;
  std::list<Hash> lru_;  // most recent first
  std::unordered_map<Hash, std::pair<std::shared_ptr<Executable>, std::list<Hash>::iterator>> map_;
};

}  // namespace spmd::runtime
