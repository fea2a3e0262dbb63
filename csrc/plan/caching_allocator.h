// How much device memory an eager PyTorch step reserves, not only what its tensors hold:
// PyTorch's CUDA caching allocator (c10/cuda/CUDACachingAllocator.cpp) keeps freed blocks
// for reuse and never returns a segment it took from the device, so a step whose big
// transient values are freed and followed by allocations of other sizes reserves more than
// its live bytes ever add up to (torch.cuda.max_memory_reserved against
// max_memory_allocated; torchtitan logs the former).
//
// Its rules as modelled: a request rounds up to a multiple of 512 bytes; requests up to 1 MiB
// come from a pool of 2 MiB segments, larger ones from a pool of segments of 20 MiB (requests
// under 10 MiB) or of the request rounded up to 2 MiB; a request takes the smallest free block
// of its pool that holds it, split when what is left is at least 512 bytes (small pool) or
// more than 1 MiB (large pool); a freed block merges with the free blocks beside it in its
// segment. One stream, no expandable segments, no cache emptied on an out-of-memory retry.
#pragma once
#include <cstdint>
#include <map>
#include <vector>

#include "partition/program.h"

namespace spmd::plan {

// The compiler's types this floor reads.
using partition::Program;

class CachingAllocatorModel {
 public:
  // A handle for `bytes` (0: nothing, handle 0).
  uint64_t Malloc(int64_t bytes);
  void Free(uint64_t handle);
  int64_t reserved() const { return reserved_; }
  int64_t peak_reserved() const { return peak_reserved_; }

 private:
  struct Block {
    int64_t size = 0;
    bool free = true;
  };
  struct Segment {
    bool small = false;
    std::map<int64_t, Block> blocks;  // by offset
  };
  using Where = std::pair<size_t, int64_t>;  // segment, offset
  void AddFree(size_t segment, int64_t offset);
  void RemoveFree(size_t segment, int64_t offset);

  std::vector<Segment> segments_;
  std::multimap<int64_t, Where> free_[2];  // per pool (large, small): free blocks by size
  std::map<uint64_t, Where> live_;
  uint64_t next_ = 1;
  int64_t reserved_ = 0, peak_reserved_ = 0;
};

// The most memory a device's caching allocator reserves while it runs `program`: `beside`
// bytes of other live tensors and the parameters first, then each node's results, freeing
// each value after its last reader (the liveness of partition/cost.h, `donated` as there).
int64_t ReservedPeakPerDevice(const Program& program, int64_t beside,
                              const std::vector<bool>* donated = nullptr);

}  // namespace spmd::plan
