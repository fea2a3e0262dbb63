// Plan mode's programs by step key (aten's PlanStep keys them as the compile cache keys its
// executables: the graph, the step's partitioning options and the device count). A training
// loop replans the same few graphs; a search over layouts (auto_shard) plans hundreds once
// each. Programs of pod-sized steps are large (a 70B step's has tens of thousands of nodes,
// tens of MB), and holding many of them slows every later partitioning (the heap they fill;
// docs/benchmarks.md, "Design measurements"), so the cache is bounded by the programs' nodes
// as well as by their number, the least recently used dropped first.
#pragma once
#include <cstddef>
#include <list>
#include <memory>
#include <mutex>
#include <utility>

#include "core/hash.h"
#include "partition/program.h"

namespace spmd::plan {

class PlanCache {
 public:
  static constexpr size_t kEntries = 16;
  static constexpr size_t kNodes = 32768;

  static PlanCache& Get();
  PlanCache(size_t entries = kEntries, size_t nodes = kNodes)
      : max_entries_(entries), max_nodes_(nodes) {}

  // The program for `key`, now the most recently used; null when there is none.
  std::shared_ptr<const partition::Program> Lookup(Hash key);
  // Drops the least recently used programs until one more, of about `nodes` nodes, fits: done
  // before partitioning it (a program has about as many nodes as its graph), so that the
  // partitioning reuses what they free.
  void MakeRoom(size_t nodes);
  // Adds `program` as the most recently used (MakeRoom made its room).
  void Insert(Hash key, std::shared_ptr<const partition::Program> program);
  size_t size() const;

 private:
  void DropWhileFull(size_t incoming_nodes);
  const size_t max_entries_, max_nodes_;
  mutable std::mutex mu_;
  size_t nodes_ = 0;
  // The most recently used first.
  std::list<std::pair<Hash, std::shared_ptr<const partition::Program>>> entries_;
};

}  // namespace spmd::plan
