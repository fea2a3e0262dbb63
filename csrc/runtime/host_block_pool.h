// The emulated devices' memory stays with them between steps, as an accelerator's caching
// allocator keeps its blocks (XLA's BFC allocator, PyTorch's CUDA caching allocator).
//
// Why: a step allocates and frees the same large buffers every time (activations, gradients,
// the optimizer's new state), and the host's malloc hands large blocks back to the kernel on
// free (mmap'd blocks, a trimmed heap top), so each step pays a page fault per 4 KiB it
// touches again, where eager PyTorch's own tensors, freed and reallocated at other sizes,
// mostly stay in the heap (docs/benchmarks.md, "Design measurements", has the counts).
//
// How: while a `PooledHostAllocations` guard is alive on a thread, CPU allocations of at least
// kMinPooledBytes made on that thread come from a pool of blocks kept across frees (by size
// class, so a step's buffers find the blocks the step before freed). Everything else, on every
// other thread, goes to the CPU allocator that was installed before, unchanged. A block freed
// on any thread goes back to the pool. The pool keeps at most its high-water mark of bytes in
// use plus kSlackBytes; free blocks beyond that go back to the host. SPMD_HOST_POOL=0 (read
// once) leaves torch's allocator alone.
#pragma once
#include <cstddef>

namespace spmd::runtime {

class PooledHostAllocations {
 public:
  PooledHostAllocations();  // installs the pool as torch's CPU allocator on first use
  ~PooledHostAllocations();
  PooledHostAllocations(const PooledHostAllocations&) = delete;
  PooledHostAllocations& operator=(const PooledHostAllocations&) = delete;

 private:
  bool previous_;
};

struct HostPoolStats {
  size_t bytes_in_use = 0;    // pooled blocks held by tensors
  size_t bytes_cached = 0;    // pooled blocks free for reuse
  size_t high_water = 0;      // most bytes_in_use at once
  size_t blocks_reused = 0;   // allocations served from the pool
  size_t blocks_created = 0;  // allocations that took new memory from the host
};
HostPoolStats GetHostPoolStats();

// Gives every cached (free) block back to the host; blocks in use are untouched.
void ReleaseCachedHostBlocks();

}  // namespace spmd::runtime
