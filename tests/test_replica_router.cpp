// Data-parallel routing: a shared first block keeps prompts on one replica (prefix-cache
// affinity) until that replica is `slack` requests busier than the least loaded one.
#include <gtest/gtest.h>

#include <numeric>
#include <set>

#include "engine/replica_router.h"

namespace hsx {
namespace {

std::vector<int32_t> Prompt(int32_t first, int len) {
  std::vector<int32_t> p(static_cast<size_t>(len));
  std::iota(p.begin(), p.end(), first);
  return p;
}

TEST(ReplicaRouterTest, SharedFirstBlockGoesToOneReplica) {
  const ReplicaRouter router(16, 4);
  std::set<int> preferred;
  for (int first = 0; first < 64; ++first) preferred.insert(router.Preferred(Prompt(first * 100, 16), 4));
  EXPECT_EQ(preferred.size(), 4u) << "first blocks should spread over every replica";
  for (int first = 0; first < 64; ++first) {
    std::vector<int32_t> a = Prompt(first * 100, 40), b = a;
    b.resize(20);  // the same first block, a different rest
    b.back() = 7;
    const std::vector<size_t> loads{0, 0, 0, 0};
    EXPECT_EQ(router.Pick(a, loads), router.Pick(b, loads)) << first;
    EXPECT_EQ(router.Pick(a, loads), router.Preferred(a, 4));
  }
}

TEST(ReplicaRouterTest, ByLoadOtherwise) {
  const ReplicaRouter router(16, 4);
  // A prompt shorter than a block: the least loaded, lowest index among equals.
  EXPECT_EQ(router.Pick(Prompt(0, 15), {3, 1, 1, 2}), 1);
  EXPECT_EQ(router.Pick(Prompt(0, 15), {0, 0}), 0);
  // Find a prompt preferring replica 2 of 3.
  std::vector<int32_t> p;
  for (int first = 0; router.Preferred(p, 3) != 2; ++first) p = Prompt(first * 100, 16);
  EXPECT_EQ(router.Pick(p, {0, 0, 3}), 2);  // busier, within the slack: affinity wins
  EXPECT_EQ(router.Pick(p, {0, 1, 4}), 0);  // the slack reached: the least loaded
  EXPECT_EQ(router.Pick(p, {5, 4, 7}), 2);
  EXPECT_EQ(router.Pick(p, {5, 4, 8}), 1);
  EXPECT_EQ(ReplicaRouter(16, 0).Pick(p, {0, 0, 0}), 0);  // no slack: load alone
  EXPECT_EQ(router.Pick(p, {}), -1);
}

}  // namespace
}  // namespace hsx
