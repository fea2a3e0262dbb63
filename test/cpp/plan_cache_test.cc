// Plan mode's program cache (plan/plan_cache.h): least recently used first out, bounded by
// entries and by nodes.
#include "plan/plan_cache.h"

#include <gtest/gtest.h>

#include <memory>

namespace spmd::plan {
namespace {

std::shared_ptr<const partition::Program> ProgramOf(size_t nodes) {
  auto p = std::make_shared<partition::Program>();
  p->nodes.resize(nodes);
  return p;
}

TEST(PlanCacheTest, TheLeastRecentlyUsedGoesFirst) {
  PlanCache cache(/*entries=*/3, /*nodes=*/1000);
  for (Hash k : {1, 2, 3}) {
    cache.MakeRoom(10);
    cache.Insert(k, ProgramOf(10));
  }
  ASSERT_NE(cache.Lookup(1), nullptr);  // 1 is now the most recently used
  cache.MakeRoom(10);  // full: 2 goes
  cache.Insert(4, ProgramOf(10));
  EXPECT_EQ(cache.size(), 3u);
  EXPECT_EQ(cache.Lookup(2), nullptr);
  EXPECT_NE(cache.Lookup(1), nullptr);
  EXPECT_NE(cache.Lookup(3), nullptr);
  EXPECT_NE(cache.Lookup(4), nullptr);
}

TEST(PlanCacheTest, BoundedByNodesBeforeTheNextProgramIsMade) {
  PlanCache cache(/*entries=*/16, /*nodes=*/100);
  cache.Insert(1, ProgramOf(40));
  cache.Insert(2, ProgramOf(40));
  cache.MakeRoom(30);  // 80 + 30 > 100: the older one goes
  EXPECT_EQ(cache.Lookup(1), nullptr);
  EXPECT_NE(cache.Lookup(2), nullptr);
  cache.MakeRoom(500);  // larger than the bound: everything goes, the program still made
  EXPECT_EQ(cache.size(), 0u);
}

TEST(PlanCacheTest, AKeyInsertedAgainReplacesItsProgram) {
  PlanCache cache(4, 1000);
  cache.Insert(7, ProgramOf(5));
  auto newer = ProgramOf(6);
  cache.Insert(7, newer);
  EXPECT_EQ(cache.size(), 1u);
  EXPECT_EQ(cache.Lookup(7), newer);
}

}  // namespace
}  // namespace spmd::plan
