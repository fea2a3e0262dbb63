// The caching allocator model (plan/caching_allocator.h) against PyTorch's rules worked
// by hand: rounding, the two pools and their segment sizes, best fit, splitting, merging, and
// the fragmentation that makes a step reserve more than it ever holds.
#include "plan/caching_allocator.h"

#include <gtest/gtest.h>

namespace spmd::plan {
using namespace spmd::partition;  // the compiler's types the model reads
namespace {

constexpr int64_t kMiB = 1 << 20;

TEST(CachingAllocatorTest, SegmentsPerPoolAndReuseOfFreedBlocks) {
  CachingAllocatorModel a;
  EXPECT_EQ(a.Malloc(0), 0u);
  uint64_t small = a.Malloc(100);  // rounds to 512 B, from a 2 MiB small segment
  EXPECT_EQ(a.reserved(), 2 * kMiB);
  uint64_t mid = a.Malloc(3 * kMiB);  // a 20 MiB large segment
  EXPECT_EQ(a.reserved(), 22 * kMiB);
  // The 20 MiB segment split: 3 MiB used, 17 MiB free. An 11 MiB request takes that rest.
  uint64_t eleven = a.Malloc(11 * kMiB);
  EXPECT_EQ(a.reserved(), 22 * kMiB);
  uint64_t big = a.Malloc(17 * kMiB + 1);  // fits nothing free: its own segment, 18 MiB
  EXPECT_EQ(a.reserved(), 40 * kMiB);
  a.Free(big);
  uint64_t again = a.Malloc(18 * kMiB);  // the freed 18 MiB block: nothing new
  EXPECT_EQ(a.reserved(), 40 * kMiB);
  for (uint64_t h : {small, mid, eleven, again}) a.Free(h);
  EXPECT_EQ(a.peak_reserved(), 40 * kMiB);
}

TEST(CachingAllocatorTest, FreedNeighboursMergeAndFragmentationReservesMore) {
  CachingAllocatorModel a;
  // Two 100 MiB values side by side in one segment each; freed, each stays cached. A 150 MiB
  // request fits neither: a third segment, though only 150 MiB is ever live.
  uint64_t x = a.Malloc(100 * kMiB), y = a.Malloc(100 * kMiB);
  a.Free(x);
  a.Free(y);
  uint64_t z = a.Malloc(150 * kMiB);
  EXPECT_EQ(a.reserved(), 350 * kMiB);
  a.Free(z);
  // Within one segment, freed neighbours merge: a 40 MiB segment split in two 20 MiB blocks,
  // both freed, takes a 40 MiB request again.
  CachingAllocatorModel b;
  uint64_t whole = b.Malloc(40 * kMiB);
  b.Free(whole);
  uint64_t p = b.Malloc(20 * kMiB), q = b.Malloc(20 * kMiB);
  EXPECT_EQ(b.reserved(), 40 * kMiB);
  b.Free(p);
  b.Free(q);
  b.Malloc(40 * kMiB);
  EXPECT_EQ(b.reserved(), 40 * kMiB);
}

}  // namespace
}  // namespace spmd::plan
