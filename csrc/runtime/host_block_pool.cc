#include "runtime/host_block_pool.h"

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>

#include <algorithm>
#include <bit>
#include <cstdlib>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace spmd::runtime {
namespace {

// Below this size malloc keeps freed memory itself (its small-block bins), so pooling gains
// nothing and would only hold memory back.
constexpr size_t kMinPooledBytes = size_t{64} << 10;
// Cached bytes the pool may hold beyond its high-water mark of bytes in use (a step whose
// buffer sizes shift a little then still finds blocks).
constexpr size_t kSlackBytes = size_t{64} << 20;

thread_local bool pooling_on_this_thread = false;

// A request rounded up to its size class: eight classes per power of two (at most 12.5% of a
// block unused), so buffers of nearly the same size share blocks.
size_t SizeClass(size_t n) {
  const size_t granule = std::max<size_t>(4096, std::bit_floor(n) / 8);
  return (n + granule - 1) / granule * granule;
}

class HostBlockPool final : public at::Allocator {
 public:
  static HostBlockPool& Get() {
    static auto* pool = new HostBlockPool();  // never destroyed: blocks may outlive exit paths
    return *pool;
  }

  // Becomes torch's CPU allocator once (unless SPMD_HOST_POOL=0); returns whether it is the
  // current one (another library may have installed its own since).
  bool Install() {
    std::call_once(installed_, [this] {
      backing_ = c10::GetCPUAllocator();
      const char* env = std::getenv("SPMD_HOST_POOL");
      if (env && std::string(env) == "0") return;
      c10::SetCPUAllocator(this, /*priority=*/0);
    });
    return c10::GetCPUAllocator() == this;
  }

  at::DataPtr allocate(size_t n) override {
    if (!pooling_on_this_thread || n < kMinPooledBytes) return backing_->allocate(n);
    const size_t size = SizeClass(n);
    void* data = nullptr;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      std::vector<void*>& free = cached_[size];
      if (!free.empty()) {
        data = free.back();
        free.pop_back();
        stats_.bytes_cached -= size;
        ++stats_.blocks_reused;
      } else {
        TrimLocked(size);
        ++stats_.blocks_created;
      }
      if (data) Track(data, size);
    }
    if (!data) {
      data = NewBlock(size);  // outside the lock: the host may take a while
      std::lock_guard<std::mutex> lock(mutex_);
      Track(data, size);
    }
    return {data, data, &Free, at::Device(at::kCPU)};
  }

  // The raw interface belongs to the allocator underneath: pooled blocks only ever leave
  // through their DataPtr's deleter (Free); a block that took the raw route is still memory
  // from alloc_cpu, which the backing deleter frees.
  c10::DeleterFnPtr raw_deleter() const override { return backing_->raw_deleter(); }

  void copy_data(void* dest, const void* src, size_t count) const override {
    default_copy_data(dest, src, count);
  }

  HostPoolStats Stats() {
    std::lock_guard<std::mutex> lock(mutex_);
    return stats_;
  }

  void ReleaseCached() {
    std::lock_guard<std::mutex> lock(mutex_);
    TrimLocked(SIZE_MAX);
  }

 private:
  static void Free(void* data) { Get().Return(data); }

  // Memory from the host; when it has none, the cached blocks go back first and it is asked
  // once more (alloc_cpu's out-of-memory error then stands).
  void* NewBlock(size_t size) {
    try {
      return c10::alloc_cpu(size);
    } catch (const c10::Error&) {
      ReleaseCached();
      return c10::alloc_cpu(size);
    }
  }

  void Track(void* data, size_t size) {
    in_use_[data] = size;
    stats_.bytes_in_use += size;
    stats_.high_water = std::max(stats_.high_water, stats_.bytes_in_use);
  }

  void Return(void* data) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = in_use_.find(data);
    if (it == in_use_.end()) {  // cannot happen: only pooled blocks carry this deleter
      c10::free_cpu(data);
      return;
    }
    const size_t size = it->second;
    in_use_.erase(it);
    stats_.bytes_in_use -= size;
    cached_[size].push_back(data);
    stats_.bytes_cached += size;
    TrimLocked(0);
  }

  // Gives cached blocks back to the host, largest first, until `incoming` more bytes in use
  // fit under high water + slack (all of them for SIZE_MAX).
  void TrimLocked(size_t incoming) {
    const size_t limit = stats_.high_water + kSlackBytes;
    auto over = [&] {
      if (incoming == SIZE_MAX) return stats_.bytes_cached > 0;
      return stats_.bytes_in_use + stats_.bytes_cached + incoming > limit &&
             stats_.bytes_cached > 0;
    };
    while (over()) {
      auto largest = std::max_element(cached_.begin(), cached_.end(), [](auto& a, auto& b) {
        return (a.second.empty() ? 0 : a.first) < (b.second.empty() ? 0 : b.first);
      });
      c10::free_cpu(largest->second.back());
      largest->second.pop_back();
      stats_.bytes_cached -= largest->first;
    }
  }

  std::once_flag installed_;
  at::Allocator* backing_ = nullptr;
  std::mutex mutex_;
  std::unordered_map<size_t, std::vector<void*>> cached_;  // size class -> free blocks
  std::unordered_map<void*, size_t> in_use_;               // pooled block -> its size class
  HostPoolStats stats_;
};

}  // namespace

PooledHostAllocations::PooledHostAllocations() : previous_(pooling_on_this_thread) {
  pooling_on_this_thread = HostBlockPool::Get().Install();
}

PooledHostAllocations::~PooledHostAllocations() { pooling_on_this_thread = previous_; }

HostPoolStats GetHostPoolStats() { return HostBlockPool::Get().Stats(); }

void ReleaseCachedHostBlocks() { HostBlockPool::Get().ReleaseCached(); }

}  // namespace spmd::runtime
