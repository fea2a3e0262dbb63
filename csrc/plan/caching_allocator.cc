#include "plan/caching_allocator.h"

#include <algorithm>
#include <iterator>

#include "core/error.h"
#include "partition/cost.h"

namespace spmd::plan {

using partition::LiveValue;
using partition::ValueLifetimes;

namespace {

constexpr int64_t kMinBlock = 512;                // every request rounds up to this
constexpr int64_t kSmallRequest = 1 << 20;        // up to this: the small pool
constexpr int64_t kSmallSegment = 2 << 20;        // its segments
constexpr int64_t kMidRequest = 10 << 20;         // below this: 20 MiB large segments
constexpr int64_t kMidSegment = 20 << 20;
constexpr int64_t kRoundLarge = 2 << 20;          // larger segments round up to this

int64_t RoundUp(int64_t x, int64_t to) { return (x + to - 1) / to * to; }

}  // namespace

void CachingAllocatorModel::AddFree(size_t segment, int64_t offset) {
  Segment& s = segments_[segment];
  free_[s.small].emplace(s.blocks.at(offset).size, Where{segment, offset});
}

void CachingAllocatorModel::RemoveFree(size_t segment, int64_t offset) {
  Segment& s = segments_[segment];
  auto range = free_[s.small].equal_range(s.blocks.at(offset).size);
  for (auto it = range.first; it != range.second; ++it)
    if (it->second == Where{segment, offset}) {
      free_[s.small].erase(it);
      return;
    }
  SPMD_FAIL("internal error: caching allocator model lost a free block");
}

uint64_t CachingAllocatorModel::Malloc(int64_t bytes) {
  if (bytes <= 0) return 0;
  const int64_t size = RoundUp(bytes, kMinBlock);
  const bool small = size <= kSmallRequest;
  auto& pool = free_[small];
  auto fit = pool.lower_bound(size);
  Where at;
  if (fit != pool.end()) {
    at = fit->second;
    pool.erase(fit);
  } else {  // a new segment from the device
    const int64_t segment = small ? kSmallSegment
                            : size < kMidRequest ? kMidSegment : RoundUp(size, kRoundLarge);
    segments_.push_back(Segment{small, {{0, Block{segment, true}}}});
    reserved_ += segment;
    peak_reserved_ = std::max(peak_reserved_, reserved_);
    at = Where{segments_.size() - 1, 0};
  }
  Segment& s = segments_[at.first];
  Block& b = s.blocks.at(at.second);
  const int64_t rest = b.size - size;
  if (small ? rest >= kMinBlock : rest > kSmallRequest) {  // split off what is left
    b.size = size;
    s.blocks.emplace(at.second + size, Block{rest, true});
    AddFree(at.first, at.second + size);
  }
  s.blocks.at(at.second).free = false;
  live_.emplace(next_, at);
  return next_++;
}

void CachingAllocatorModel::Free(uint64_t handle) {
  if (handle == 0) return;
  auto it = live_.find(handle);
  SPMD_CHECK(it != live_.end(), "internal error: caching allocator model frees a block twice");
  auto [segment, offset] = it->second;
  live_.erase(it);
  Segment& s = segments_[segment];
  auto block = s.blocks.find(offset);
  block->second.free = true;
  // Merge with a free block after it, then before it.
  auto next = std::next(block);
  if (next != s.blocks.end() && next->second.free) {
    RemoveFree(segment, next->first);
    block->second.size += next->second.size;
    s.blocks.erase(next);
  }
  if (block != s.blocks.begin()) {
    auto prev = std::prev(block);
    if (prev->second.free) {
      RemoveFree(segment, prev->first);
      prev->second.size += block->second.size;
      s.blocks.erase(block);
      block = prev;
    }
  }
  AddFree(segment, block->first);
}

int64_t ReservedPeakPerDevice(const Program& program, int64_t beside,
                              const std::vector<bool>* donated) {
  CachingAllocatorModel allocator;
  allocator.Malloc(beside);
  const std::vector<LiveValue> values = ValueLifetimes(program, donated);
  // Parameters are there before the step; the rest is made at its node.
  std::vector<std::vector<size_t>> made(program.nodes.size()), dying(program.nodes.size());
  std::vector<uint64_t> handle(values.size(), 0);
  for (size_t v = 0; v < values.size(); ++v) {
    if (values[v].node->is_data())
      handle[v] = allocator.Malloc(values[v].bytes);
    else
      made[values[v].defined_at].push_back(v);
    if (values[v].last_use < static_cast<int>(program.nodes.size()))
      dying[values[v].last_use].push_back(v);
  }
  for (size_t i = 0; i < program.nodes.size(); ++i) {
    for (size_t v : made[i]) handle[v] = allocator.Malloc(values[v].bytes);
    for (size_t v : dying[i]) allocator.Free(handle[v]);
  }
  return allocator.peak_reserved();
}

}  // namespace spmd::plan
