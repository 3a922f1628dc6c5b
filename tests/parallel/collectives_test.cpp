// Ring collectives (issue 5): allreduce, reduce-scatter, all-gather and
// broadcast over a ring of reducer actors, element by element against a
// float64 reference, bitwise equal across ranks; in one process (zero-copy
// messages) and across processes (this binary re-executes itself as the
// other nodes; chunks go over the UCX data plane).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <signal.h>
#include <unistd.h>

#include <cstring>
#include <limits>
#include <thread>

#include "ring_support.hpp"
#include "reducer_member.hpp"
#include "same_host_workspace.hpp"
#include "troupe/parallel/collectives.hpp"

using namespace std::chrono_literals;
using namespace troupe;
using namespace troupe::parallel;
using troupe::test::child_process;
using troupe::test::cluster;
using troupe::test::local_ring;
using troupe::test::places_for;
using troupe::test::start_cluster;
using ::testing::HasSubstr;

namespace {

/// Rank r's input: small integers (exact float32 sums) plus a fraction so
/// the order of additions matters for bitwise comparisons.
float value(std::uint32_t rank, std::int64_t i) {
  return static_cast<float>((i * 7 + rank * 13) % 23) + 0.1f * static_cast<float>(rank + 1);
}

tensor input(std::uint32_t rank, std::int64_t count) {
  std::vector<float> v(static_cast<std::size_t>(count));
  for (std::int64_t i = 0; i < count; ++i)
    v[static_cast<std::size_t>(i)] = value(rank, i);
  return tensor::from(v, {count});
}

double reference(std::uint32_t n, std::int64_t i) {
  double sum = 0;
  for (std::uint32_t r = 0; r < n; ++r)
    sum += static_cast<double>(value(r, i));
  return sum;
}

bool bitwise_equal(const tensor& a, const tensor& b) {
  return a.numel() == b.numel() && std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
}

std::vector<std::int64_t> sizes_for(std::int64_t n) {
  return {1, 2, 3, 7, n - 1, n, n + 1, 1000, 4099, (1 << 20) / 4};
}

class Collectives : public ::testing::TestWithParam<std::uint32_t> {};

/// Every allreduce of sizes_for(n) on `ring`, checked against float64 and
/// across ranks.
void check_allreduce_sizes(local_ring& ring, std::uint32_t n) {
  for (auto count : sizes_for(n)) {
    std::vector<tensor> data(n);
    std::vector<std::string> errors(n);
    ring.each([&](std::uint32_t k) {
      data[k] = input(k, count);
      auto ok = ring_allreduce(*ring.groups[k], data[k]);
      if (!ok)
        errors[k] = ok.error().message();
    });
    for (std::uint32_t k = 0; k < n; ++k)
      ASSERT_EQ(errors[k], "") << "rank " << k << " count " << count;
    auto got = data[0].to_vector<float>();
    for (std::int64_t i = 0; i < count; ++i)
      ASSERT_NEAR(got[static_cast<std::size_t>(i)], reference(n, i), 1e-5 * reference(n, i))
        << "element " << i << " of " << count;
    for (std::uint32_t k = 1; k < n; ++k)
      EXPECT_TRUE(bitwise_equal(data[0], data[k])) << "rank " << k << " count " << count;
  }
}

constexpr auto ring_path = same_host_algorithm::ring;
constexpr auto shared_path = same_host_algorithm::shared_memory;

TEST_P(Collectives, AllreduceSumMatchesReferenceAndIsBitwiseEqual) {
  const auto n = GetParam();
  local_ring ring(n, 1024, 5000ms, 1, ring_path); // 1 KiB chunks: many per segment
  ASSERT_TRUE(ring.node);
  EXPECT_FALSE(ring.groups[0]->shares_memory());
  check_allreduce_sizes(ring, n);
}

TEST_P(Collectives, SameHostAllreduceMatchesReferenceAndIsBitwiseEqual) {
  const auto n = GetParam();
  // 4 KiB passes: the larger sizes take hundreds of passes through both slots.
  local_ring ring(n, 1024, 5000ms, 1, shared_path, 4096);
  ASSERT_TRUE(ring.node);
  for (auto& g : ring.groups)
    ASSERT_TRUE(g->shares_memory());
  check_allreduce_sizes(ring, n);
}

TEST_P(Collectives, SegmentsShorterThanAChunkAreCutIntoSeveral) {
  const auto n = GetParam();
  // 1 MiB chunks, at least 4 per segment (of at least 64 KiB): the large
  // sizes take the min_chunks path.
  local_ring ring(n, std::size_t{1} << 20, 5000ms, 4, ring_path);
  ASSERT_TRUE(ring.node);
  check_allreduce_sizes(ring, n);
}

/// A float64 average on `ring` against the reference, bitwise equal across ranks.
void check_average_float64(local_ring& ring, std::uint32_t n) {
  const std::int64_t count = 4099;
  std::vector<tensor> data(n);
  ring.each([&](std::uint32_t k) {
    data[k] = input(k, count).to(dtype::float64);
    EXPECT_TRUE(ring_allreduce(*ring.groups[k], data[k], {.op = reduce_op::average}));
  });
  auto got = data[0].to_vector<double>();
  for (std::int64_t i = 0; i < count; ++i)
    ASSERT_NEAR(got[static_cast<std::size_t>(i)], reference(n, i) / n, 1e-12);
  for (std::uint32_t k = 1; k < n; ++k)
    EXPECT_TRUE(bitwise_equal(data[0], data[k]));
}

TEST_P(Collectives, AllreduceAverageFloat64) {
  const auto n = GetParam();
  for (auto path : {ring_path, shared_path}) {
    local_ring ring(n, 1024, 5000ms, 1, path, 4096);
    ASSERT_TRUE(ring.node);
    check_average_float64(ring, n);
  }
}

/// Every rank's reduce-scatter, all-gather and broadcast of `ring`, for
/// every size, against the reference.
void check_reduce_scatter_all_gather_broadcast(local_ring& ring, std::uint32_t n) {
  for (auto count : sizes_for(n)) {
    std::vector<tensor> scattered(n), gathered(n), broadcasted(n);
    ring.each([&](std::uint32_t k) {
      auto rs = reduce_scatter(*ring.groups[k], input(k, count));
      EXPECT_TRUE(rs) << rs.error().message();
      if (rs)
        scattered[k] = *rs;
      auto ag = all_gather(*ring.groups[k], input(k, count));
      EXPECT_TRUE(ag) << ag.error().message();
      if (ag)
        gathered[k] = *ag;
      broadcasted[k] = input(k, count);
      EXPECT_TRUE(broadcast(*ring.groups[k], broadcasted[k], {.root = n - 1}));
    });
    for (std::uint32_t k = 0; k < n; ++k) {
      auto seg = ring_segment(count, n, k);
      ASSERT_EQ(scattered[k].numel(), seg.end - seg.begin);
      auto rs = scattered[k].to_vector<float>();
      for (std::int64_t i = seg.begin; i < seg.end; ++i)
        ASSERT_NEAR(rs[static_cast<std::size_t>(i - seg.begin)], reference(n, i), 1e-5 * reference(n, i));
      ASSERT_EQ(gathered[k].numel(), count * n);
      auto ag = gathered[k].to_vector<float>();
      for (std::uint32_t r = 0; r < n; ++r)
        for (std::int64_t i = 0; i < count; ++i)
          ASSERT_EQ(ag[static_cast<std::size_t>(r * count + i)], value(r, i));
      EXPECT_TRUE(bitwise_equal(broadcasted[k], input(n - 1, count))) << "rank " << k << " count " << count;
    }
  }
}

TEST_P(Collectives, ReduceScatterAllGatherBroadcast) {
  const auto n = GetParam();
  // On one host every collective takes the shared-memory path (4 KiB
  // passes: many of them); with ring_path, the ring.
  for (auto path : {ring_path, shared_path}) {
    SCOPED_TRACE(path == ring_path ? "ring" : "shared memory");
    local_ring ring(n, 1024, 5000ms, 1, path, 4096);
    ASSERT_TRUE(ring.node);
    for (auto& g : ring.groups)
      ASSERT_EQ(g->shares_memory(), path == shared_path);
    check_reduce_scatter_all_gather_broadcast(ring, n);
  }
}

/// After two allreduces run at once: a[k] (every rank's input(k, count))
/// sums to the reference, b[k] (every rank's k + 1) to n(n+1)/2.
void check_input_and_rank_sums(const std::vector<tensor>& a, const std::vector<tensor>& b, std::uint32_t n,
                               std::int64_t count) {
  for (std::uint32_t k = 0; k < n; ++k) {
    auto va = a[k].to_vector<float>();
    for (std::int64_t i = 0; i < count; ++i)
      ASSERT_NEAR(va[static_cast<std::size_t>(i)], reference(n, i), 1e-5 * reference(n, i));
    for (float v : b[k].to_vector<float>())
      ASSERT_EQ(v, n * (n + 1) / 2.0f);
  }
}

TEST_P(Collectives, ConcurrentCollectivesWithDifferentIdsDoNotMix) {
  const auto n = GetParam();
  // The ring matches chunks by id, whatever the order of the calls.
  local_ring ring(n, 256, 5000ms, 1, ring_path);
  ASSERT_TRUE(ring.node);
  const std::int64_t count = 5000;
  std::vector<tensor> a(n), b(n);
  ring.each([&](std::uint32_t k) {
    a[k] = input(k, count);
    b[k] = tensor::full({count}, k + 1.0);
    // Issued in opposite orders on even and odd ranks.
    auto fa = ring_allreduce_async(*ring.groups[k], k % 2 ? b[k] : a[k], {.context_id = k % 2 ? 2u : 1u});
    auto fb = ring_allreduce_async(*ring.groups[k], k % 2 ? a[k] : b[k], {.context_id = k % 2 ? 1u : 2u});
    EXPECT_TRUE(fa.get());
    EXPECT_TRUE(fb.get());
  });
  check_input_and_rank_sums(a, b, n, count);
}

TEST_P(Collectives, SameHostAsyncAllreducesRunInCallOrder) {
  const auto n = GetParam();
  local_ring ring(n, 1024, 5000ms, 1, shared_path, 4096);
  ASSERT_TRUE(ring.node);
  const std::int64_t count = 5000;
  std::vector<tensor> a(n), b(n), c(n);
  ring.each([&](std::uint32_t k) {
    a[k] = input(k, count);
    b[k] = tensor::full({count}, k + 1.0);
    c[k] = tensor::full({7}, 1.0);
    // Three in flight at once: their threads may start in any order, but
    // the turns were taken here, in call order, on every rank.
    auto fa = ring_allreduce_async(*ring.groups[k], a[k]);
    auto fb = ring_allreduce_async(*ring.groups[k], b[k]);
    auto fc = ring_allreduce_async(*ring.groups[k], c[k], {.op = reduce_op::average});
    EXPECT_TRUE(fa.get());
    EXPECT_TRUE(fb.get());
    EXPECT_TRUE(fc.get());
  });
  check_input_and_rank_sums(a, b, n, count);
  for (std::uint32_t k = 0; k < n; ++k) {
    for (float v : c[k].to_vector<float>())
      ASSERT_EQ(v, 1.0f);
    EXPECT_TRUE(bitwise_equal(a[0], a[k]));
  }
}

TEST_P(Collectives, SameHostAllreducesInDifferentOrdersFailNamingTheReplica) {
  const auto n = GetParam();
  local_ring ring(n, 1024, 2000ms, 1, shared_path, 4096);
  ASSERT_TRUE(ring.node);
  std::vector<std::string> errors(n);
  std::vector<tensor> big(n), small(n);
  auto start = std::chrono::steady_clock::now();
  ring.each([&](std::uint32_t k) {
    big[k] = input(k, 3000);
    small[k] = input(k, 10);
    // Rank n-1 swaps the two: never a wrong sum, an error on every rank.
    auto& first = k + 1 == n ? small[k] : big[k];
    auto& second = k + 1 == n ? big[k] : small[k];
    auto ok = ring_allreduce(*ring.groups[k], first);
    if (ok)
      ok = ring_allreduce(*ring.groups[k], second);
    errors[k] = ok ? "" : ok.error().message();
  });
  EXPECT_LT(std::chrono::steady_clock::now() - start, 6s);
  for (std::uint32_t k = 0; k < n; ++k)
    ASSERT_NE(errors[k], "") << "rank " << k;
  // The last rank sees rank 0 at another collective, and says so.
  EXPECT_THAT(errors[n - 1], HasSubstr("replica 0 (worker0/cpu/reducer0) is at collective"));
  EXPECT_THAT(errors[n - 1], HasSubstr("same order"));
  // Later calls are refused at once with the first error.
  auto again = input(0, 10);
  auto refused = ring_allreduce(*ring.groups[n - 1], again);
  ASSERT_FALSE(refused);
  EXPECT_THAT(refused.error().message(), HasSubstr("stopped at an earlier failure"));
}

// The same-host reduce-scatter sums each element with the allreduce's
// additions in the allreduce's order, so its segment is the allreduce's
// bit for bit (what lets replicas mix the two, as ZeRO-style optimizers do);
// the same-host all-gather copies every piece exactly, -0 and NaN payloads
// included.
TEST_P(Collectives, SameHostReduceScatterIsTheAllreducesSegmentAndAllGatherIsExact) {
  const auto n = GetParam();
  local_ring ring(n, 1024, 5000ms, 1, shared_path, 4096);
  ASSERT_TRUE(ring.node);
  for (auto type : {dtype::float32, dtype::float64})
    for (auto count : sizes_for(n)) {
      std::vector<tensor> reduced(n), scattered(n), pieces(n), gathered(n);
      ring.each([&](std::uint32_t k) {
        auto data = input(k, count).to(type);
        reduced[k] = data.clone();
        EXPECT_TRUE(ring_allreduce(*ring.groups[k], reduced[k], {.op = reduce_op::average}));
        auto rs = reduce_scatter(*ring.groups[k], data, {.op = reduce_op::average});
        EXPECT_TRUE(rs) << rs.error().message();
        if (rs)
          scattered[k] = *rs;
        pieces[k] = data.clone();
        auto flat = pieces[k].flatten();
        flat.slice(0, 0, 1).fill(-0.0);
        if (count > 1)
          flat.slice(0, count - 1, count).fill(std::numeric_limits<double>::quiet_NaN());
        auto ag = all_gather(*ring.groups[k], pieces[k]);
        EXPECT_TRUE(ag) << ag.error().message();
        if (ag)
          gathered[k] = *ag;
      });
      for (std::uint32_t k = 0; k < n; ++k) {
        auto seg = ring_segment(count, n, k);
        ASSERT_TRUE(scattered[k].defined() && gathered[k].defined()) << "rank " << k << " count " << count;
        EXPECT_TRUE(bitwise_equal(scattered[k], reduced[k].slice(0, seg.begin, seg.end).clone()))
          << "rank " << k << " count " << count;
        for (std::uint32_t r = 0; r < n; ++r)
          EXPECT_TRUE(bitwise_equal(gathered[k].slice(0, r * count, (r + 1) * count).clone(), pieces[r]))
            << "rank " << k << " gathered rank " << r << "'s piece of " << count;
      }
    }
}

/// Peers' values that rank k of `ring` has read straight from their memory.
std::uint64_t read_across(local_ring& ring, std::uint32_t k) {
  return reducer_group_access::member(*ring.groups[k]).workspace()->read_across_processes();
}

/// Rank k's piece for the exactness tests: -0 first and NaN last.
tensor signed_piece(std::uint32_t k, std::int64_t count, dtype type) {
  auto t = input(k, count).to(type);
  t.flatten().slice(0, 0, 1).fill(-0.0);
  if (count > 1)
    t.flatten().slice(0, count - 1, count).fill(std::numeric_limits<double>::quiet_NaN());
  return t;
}

// The same-host broadcast hands the root's values over bit for bit (-0 and
// NaN included), from every root, in float32 and float64, over many passes.
TEST_P(Collectives, SameHostBroadcastIsExactFromEveryRoot) {
  const auto n = GetParam();
  local_ring ring(n, 1024, 5000ms, 1, shared_path, 4096);
  ASSERT_TRUE(ring.node);
  for (auto type : {dtype::float32, dtype::float64})
    for (std::uint32_t root = 0; root < n; ++root)
      for (std::int64_t count : {std::int64_t{1}, std::int64_t{1023}, std::int64_t{5000}}) {
        std::vector<tensor> data(n);
        ring.each([&](std::uint32_t k) {
          data[k] = signed_piece(k, count, type);
          auto ok = broadcast(*ring.groups[k], data[k], {.root = root});
          EXPECT_TRUE(ok) << ok.error().message();
        });
        for (std::uint32_t k = 0; k < n; ++k)
          EXPECT_TRUE(bitwise_equal(data[k], signed_piece(root, count, type)))
            << "rank " << k << ", root " << root << ", count " << count;
      }
}

// all_gather_into a heap output: each piece arrives bit for bit, read from
// its owner's memory (single copy, for pieces of 32 KiB and more) or
// through its slot; an owner returns only once the peers have read it, so
// it may change its piece at once.
TEST_P(Collectives, SameHostAllGatherIntoHeapOutputsIsExact) {
  const auto n = GetParam();
  for (bool single_copy : {true, false}) {
    local_ring ring(n, 1024, 5000ms, 1, shared_path, 4096, single_copy);
    ASSERT_TRUE(ring.node);
    for (auto type : {dtype::float32, dtype::float64})
      for (std::int64_t count : {std::int64_t{1}, std::int64_t{1023}, std::int64_t{5000}, std::int64_t{20000}}) {
        const auto piece_bytes = static_cast<std::uint64_t>(count) * size_of(type);
        const bool read_across_expected = single_copy && piece_bytes >= same_host_workspace::single_copy_min_bytes;
        std::vector<tensor> out(n);
        std::vector<std::uint64_t> read(n);
        ring.each([&](std::uint32_t k) {
          auto piece = signed_piece(k, count, type);
          out[k] = tensor::empty({count * n}, type);
          const auto before = read_across(ring, k);
          auto ok = all_gather_into(*ring.groups[k], piece, out[k]);
          EXPECT_TRUE(ok) << ok.error().message();
          read[k] = read_across(ring, k) - before;
          piece.fill(7.0); // the peers are done with it
        });
        for (std::uint32_t k = 0; k < n; ++k) {
          for (std::uint32_t r = 0; r < n; ++r)
            EXPECT_TRUE(
                bitwise_equal(out[k].slice(0, r * count, (r + 1) * count).clone(), signed_piece(r, count, type)))
              << "rank " << k << " gathered rank " << r << "'s piece of " << count << ", single copy " << single_copy;
          EXPECT_EQ(read[k] > 0, read_across_expected) << "rank " << k << ", count " << count;
        }
      }
  }
}

// Replicas that name different roots fail, naming the root they expected
// and the rank that disagrees, rather than copy from a rank that is not one.
TEST_P(Collectives, SameHostBroadcastsWithDifferentRootsFailNamingThem) {
  const auto n = GetParam();
  local_ring ring(n, 1024, 2000ms, 1, shared_path, 4096);
  ASSERT_TRUE(ring.node);
  std::vector<std::string> errors(n);
  ring.each([&](std::uint32_t k) {
    auto data = input(k, 3000);
    auto ok = broadcast(*ring.groups[k], data, {.root = k == 0 ? 0u : 1u, .context_id = 91});
    errors[k] = ok ? "" : ok.error().message();
  });
  for (std::uint32_t k = 0; k < n; ++k)
    ASSERT_NE(errors[k], "") << "rank " << k;
  // Rank 0 is the root by its own account; rank 1 sends values too.
  EXPECT_THAT(errors[0], HasSubstr("same-host broadcast 0x5b: this rank takes the root to be replica 0 "
                                   "(worker0/cpu/reducer0), but replica 1 (worker0/cpu/reducer1) sends values as a "
                                   "root"));
  // Rank 1 takes itself for the root; rank 0 sends values it should not.
  EXPECT_THAT(errors[1], HasSubstr("this rank takes the root to be replica 1 (worker0/cpu/reducer1), but replica 0 "
                                   "(worker0/cpu/reducer0) sends values as a root"));
}

// Replicas that issue a reduce-scatter and an all-gather at the same place
// (same id, same count) fail naming both, rather than sum a gather's values.
TEST_P(Collectives, SameHostCollectivesOfDifferentKindsFailNamingThem) {
  const auto n = GetParam();
  local_ring ring(n, 1024, 2000ms, 1, shared_path, 4096);
  ASSERT_TRUE(ring.node);
  std::vector<std::string> errors(n);
  ring.each([&](std::uint32_t k) {
    auto data = input(k, 3000);
    if (k + 1 == n) {
      auto ag = all_gather(*ring.groups[k], data, {.context_id = 77});
      errors[k] = ag ? "" : ag.error().message();
    } else {
      auto rs = reduce_scatter(*ring.groups[k], data, {.context_id = 77});
      errors[k] = rs ? "" : rs.error().message();
    }
  });
  for (std::uint32_t k = 0; k < n; ++k)
    ASSERT_NE(errors[k], "") << "rank " << k;
  EXPECT_THAT(errors[n - 1], HasSubstr("same-host all-gather: replica 0 (worker0/cpu/reducer0) is at collective 0x4d "
                                       "(reduce-scatter of 3000 elements"));
  EXPECT_THAT(errors[0], HasSubstr("(all-gather of 3000 elements"));
}

INSTANTIATE_TEST_SUITE_P(Ring, Collectives, ::testing::Values(2u, 3u, 4u));

class HalvingDoubling : public ::testing::TestWithParam<std::uint32_t> {};

constexpr auto halving = message_algorithm::halving_doubling;

TEST_P(HalvingDoubling, AllreduceMatchesReferenceAndIsBitwiseEqual) {
  const auto n = GetParam();
  // 1 KiB chunks: the large sizes cut each exchange into many.
  local_ring ring(n, 1024, 5000ms, 1, ring_path, 4096, true, halving);
  ASSERT_TRUE(ring.node);
  EXPECT_FALSE(ring.groups[0]->shares_memory());
  check_allreduce_sizes(ring, n);
}

TEST_P(HalvingDoubling, AverageFloat64) {
  const auto n = GetParam();
  local_ring ring(n, 1024, 5000ms, 1, ring_path, 4096, true, halving);
  ASSERT_TRUE(ring.node);
  check_average_float64(ring, n);
}

TEST_P(HalvingDoubling, ReduceScatterAllGatherBroadcast) {
  const auto n = GetParam();
  local_ring ring(n, 1024, 5000ms, 1, ring_path, 4096, true, halving);
  ASSERT_TRUE(ring.node);
  check_reduce_scatter_all_gather_broadcast(ring, n);
}

TEST_P(HalvingDoubling, AllreduceEqualsTheRingsWithinRounding) {
  // The two algorithms add in different orders: the same sums within
  // float32 rounding, each bitwise equal across its ranks (checked above).
  const auto n = GetParam();
  const std::int64_t count = 100003;
  std::vector<tensor> by_ring(n), by_halving(n);
  {
    local_ring ring(n, 4096, 5000ms, 1, ring_path);
    ring.each([&](std::uint32_t k) {
      by_ring[k] = input(k, count);
      EXPECT_TRUE(ring_allreduce(*ring.groups[k], by_ring[k]));
    });
  }
  {
    local_ring ring(n, 4096, 5000ms, 1, ring_path, 4096, true, halving);
    ring.each([&](std::uint32_t k) {
      by_halving[k] = input(k, count);
      EXPECT_TRUE(ring_allreduce(*ring.groups[k], by_halving[k]));
    });
  }
  auto a = by_ring[0].to_vector<float>();
  auto b = by_halving[0].to_vector<float>();
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); ++i)
    ASSERT_NEAR(a[i], b[i], 1e-5f * std::abs(a[i])) << "element " << i;
}

INSTANTIATE_TEST_SUITE_P(PowersOfTwo, HalvingDoubling, ::testing::Values(2u, 4u, 8u));

/// Joins n members of one node in this process, member k with
/// `algorithm(k)` (nullopt: the node's `collectives`); every rank's join
/// error ("" where it joined).
template <class F>
std::vector<std::string> join_errors(std::uint32_t n, F&& algorithm, std::string node_collectives = "automatic") {
  auto started = troupe::test::start_local_node(std::move(node_collectives));
  EXPECT_TRUE(started);
  if (!started)
    return {};
  std::vector<std::string> places;
  for (std::uint32_t k = 0; k < n; ++k)
    places.push_back("worker0/cpu/reducer" + std::to_string(k));
  std::vector<std::string> errors(n);
  {
    std::vector<std::optional<reducer_group>> groups(n);
    std::vector<std::thread> joins;
    for (std::uint32_t k = 0; k < n; ++k)
      joins.emplace_back([&, k] {
        auto g = reducer_group::join(**started, {.rank = k, .places = places, .timeout = 3000ms,
                                                 .same_host = ring_path, .messages = algorithm(k)});
        if (g)
          groups[k].emplace(std::move(*g));
        else
          errors[k] = g.error().message();
      });
    for (auto& t : joins)
      t.join();
  }
  (*started)->stop();
  return errors;
}

TEST(HalvingDoubling, AGroupWhoseSizeIsNotAPowerOfTwoIsRefused) {
  for (std::uint32_t n : {3u, 6u}) {
    auto errors = join_errors(n, [](std::uint32_t) { return halving; });
    for (std::uint32_t k = 0; k < n; ++k)
      EXPECT_THAT(errors[k], HasSubstr("halving_doubling needs a power-of-two number of members, not " +
                                       std::to_string(n)));
  }
  // The same from the node's option; a program that chooses the ring still joins.
  auto from_node = join_errors(3, [](std::uint32_t) { return std::optional<message_algorithm>{}; }, "halving-doubling");
  EXPECT_THAT(from_node[0], HasSubstr("halving_doubling needs a power-of-two number of members, not 3 (from "
                                      "--troupe.collectives=halving-doubling; use ring or automatic)"));
  auto ring_chosen = join_errors(3, [](std::uint32_t) { return message_algorithm::ring; }, "halving-doubling");
  EXPECT_EQ(ring_chosen, std::vector<std::string>(3));
}

TEST(HalvingDoubling, MembersWithDifferentAlgorithmsFailToJoinNamingThem) {
  // Rank 3 alone chooses the ring: every member learns it from the offers.
  auto errors = join_errors(4, [](std::uint32_t k) { return k == 3 ? message_algorithm::ring : halving; });
  EXPECT_THAT(errors[0], HasSubstr("replica 3 (worker0/cpu/reducer3) runs its collectives over messages by ring, "
                                   "this rank (replica 0 (worker0/cpu/reducer0)) by halving-doubling"));
  EXPECT_THAT(errors[3], HasSubstr("replica 0 (worker0/cpu/reducer0) runs its collectives over messages by "
                                   "halving-doubling, this rank (replica 3 (worker0/cpu/reducer3)) by ring"));
}

/// Ranks 0..n-2 allreduce `count` float32 by `algorithm` (unset: the
/// node's `collectives`) while rank n-1 never calls; what each of them
/// reports.
std::vector<std::string> errors_with_last_silent(std::uint32_t n, std::optional<message_algorithm> algorithm,
                                                 std::int64_t count, std::string node_collectives = "automatic") {
  local_ring ring(n, 1024, 1000ms, 1, ring_path, 4096, true, algorithm, std::move(node_collectives));
  std::vector<std::string> errors(n - 1);
  if (!ring.node)
    return errors;
  std::vector<std::thread> threads;
  for (std::uint32_t k = 0; k + 1 < n; ++k)
    threads.emplace_back([&, k] {
      auto data = input(k, count);
      auto ok = ring_allreduce(*ring.groups[k], data);
      errors[k] = ok ? "" : ok.error().message();
    });
  for (auto& t : threads)
    t.join();
  return errors;
}

TEST(HalvingDoubling, ASilentMemberTimesOutNamingThePartnerWaitedFor) {
  // Rank 0 trades with rank 2, then with rank 1, which waits for rank 3
  // first: rank 0 names replica 1 (on the ring it would name its left
  // neighbour, replica 3), ranks 1 and 2 name replica 3.
  auto errors = errors_with_last_silent(4, halving, 4099);
  EXPECT_THAT(errors[0], HasSubstr("nothing from replica 1 (worker0/cpu/reducer1)"));
  EXPECT_THAT(errors[1], HasSubstr("nothing from replica 3 (worker0/cpu/reducer3)"));
  EXPECT_THAT(errors[2], HasSubstr("nothing from replica 3 (worker0/cpu/reducer3)"));
}

/// Who rank 0 waits for says which algorithm ran (see the test above):
/// `partner` under halving-doubling for `floats` float32, rank n - 1 (its
/// left neighbour) on the ring for one float more.
void expect_automatic_bound(std::uint32_t n, std::int64_t floats, std::uint32_t partner) {
  auto at = errors_with_last_silent(n, message_algorithm::automatic, floats);
  EXPECT_THAT(at[0], HasSubstr(fmt::format("nothing from replica {} (worker0/cpu/reducer{})", partner, partner)));
  auto above = errors_with_last_silent(n, message_algorithm::automatic, floats + 1);
  EXPECT_THAT(above[0], HasSubstr(fmt::format("nothing from replica {} (worker0/cpu/reducer{})", n - 1, n - 1)));
}

TEST(HalvingDoubling, AutomaticHalvesUpTo256KiBAndRingsAbove) { expect_automatic_bound(4, 65536, 1); }

TEST(HalvingDoubling, AutomaticFoldsAGroupOfSixForAnAllreduce) {
  // Ranks 4 and 5 fold into 0 and 1; rank 5 is silent. Rank 1 waits for
  // it; rank 0, done with rank 4 and rank 2, then waits for rank 1; rank 4
  // for its result from rank 0. On the ring rank 0 and rank 4 would name
  // their left neighbours, replicas 5 and 3.
  auto errors = errors_with_last_silent(6, message_algorithm::automatic, 4099);
  EXPECT_THAT(errors[1], HasSubstr("nothing from replica 5 (worker0/cpu/reducer5)"));
  EXPECT_THAT(errors[0], HasSubstr("nothing from replica 1 (worker0/cpu/reducer1)"));
  EXPECT_THAT(errors[4], HasSubstr("nothing from replica 0 (worker0/cpu/reducer0)"));
}

TEST(HalvingDoubling, AutomaticFoldsAllreducesUpTo64KiB) { expect_automatic_bound(6, 16384, 1); }

TEST(HalvingDoubling, TheNodesCollectivesOptionChoosesWhereTheProgramDoesNot) {
  // Who rank 0 of 4 waits for says which algorithm ran: its halving
  // partner, replica 1, or its left neighbour on the ring, replica 3.
  auto halved = errors_with_last_silent(4, std::nullopt, 4099, "halving-doubling");
  EXPECT_THAT(halved[0], HasSubstr("nothing from replica 1 (worker0/cpu/reducer1)"));
  auto ringed = errors_with_last_silent(4, std::nullopt, 4099, "ring");
  EXPECT_THAT(ringed[0], HasSubstr("nothing from replica 3 (worker0/cpu/reducer3)"));
  // The program's own choice wins over the node's.
  auto chosen = errors_with_last_silent(4, halving, 4099, "ring");
  EXPECT_THAT(chosen[0], HasSubstr("nothing from replica 1 (worker0/cpu/reducer1)"));
}

TEST(HalvingDoubling, OptionsAfterJoiningHoldTheAlgorithmChosen) {
  for (auto [configured, want] : {std::pair{"ring", message_algorithm::ring},
                                  std::pair{"automatic", message_algorithm::automatic},
                                  std::pair{"halving-doubling", halving}}) {
    local_ring ring(2, 1024, 3000ms, 1, ring_path, 4096, true, std::nullopt, configured);
    ASSERT_TRUE(ring.node);
    for (auto& group : ring.groups)
      EXPECT_EQ(group->options().messages, want) << configured;
  }
}

TEST(HalvingDoubling, MessageAlgorithmsRoundTripTheirNames) {
  for (auto algorithm : {message_algorithm::ring, halving, message_algorithm::automatic})
    EXPECT_EQ(message_algorithm_named(name_of(algorithm)).value(), algorithm);
  // actors validates --troupe.collectives without seeing parallel's table:
  // every name here must pass there.
  for (auto algorithm : {message_algorithm::ring, halving, message_algorithm::automatic}) {
    actors::node_options options;
    EXPECT_TRUE(options.set("collectives", name_of(algorithm), "test")) << name_of(algorithm);
  }
  auto bad = message_algorithm_named("halving_doubling");
  ASSERT_FALSE(bad);
  EXPECT_EQ(bad.error().message(), "message algorithm 'halving_doubling' is not one of ring, halving-doubling, automatic");
}

TEST(HalvingDoubling, AutomaticIsExactOnEveryGroupSize) {
  // Halving-doubling up to 256 KiB, folded for an allreduce up to 64 KiB
  // where the size is not a power of two (reduce-scatter and all-gather
  // there: the ring); the ring above.
  for (std::uint32_t n : {3u, 4u, 5u, 6u, 7u}) {
    SCOPED_TRACE(n);
    local_ring ring(n, 1024, 5000ms, 1, ring_path, 4096, true, message_algorithm::automatic);
    ASSERT_TRUE(ring.node);
    check_allreduce_sizes(ring, n);
    check_average_float64(ring, n);
    check_reduce_scatter_all_gather_broadcast(ring, n);
  }
}

TEST(Collectives, AChunkOfTheWrongSizeOrTypeIsAnErrorNamingItsSender) {
  // Rank 1 plays a peer that sends rank 0 a bad first chunk of collective
  // 77 instead of taking part: too few elements, then float64 elements.
  for (auto algorithm : {message_algorithm::ring, halving}) {
    SCOPED_TRACE(algorithm == halving ? "halving-doubling" : "ring");
    for (auto bad : {tensor::from(std::vector<float>{1, 2, 3}, {3}), input(1, 100).to(dtype::float64)}) {
      local_ring ring(2, 1024, 3000ms, 1, ring_path, 4096, true, algorithm);
      ASSERT_TRUE(ring.node);
      ASSERT_TRUE(reducer_group_access::member(*ring.groups[1]).send_to(0, 77, 0, 0, bad));
      auto data = input(0, 200); // rank 0 waits for 100 (its half) under both algorithms
      auto ok = ring_allreduce(*ring.groups[0], data, {.context_id = 77});
      ASSERT_FALSE(ok);
      EXPECT_EQ(ok.error().code(), errc::malformed_message);
      EXPECT_THAT(ok.error().message(),
                  HasSubstr(fmt::format("chunk 0 of step 0 from replica 1 (worker0/cpu/reducer1) has {} elements of "
                                        "{}, want 100 of float32",
                                        bad.numel(), bad.type())));
    }
  }
}

TEST(Collectives, SilentNeighbourTimesOutNamingIt) {
  for (auto path : {ring_path, shared_path}) {
    local_ring ring(2, 1024, 1000ms, 1, path);
    ASSERT_TRUE(ring.node);
    auto data = input(0, 100);
    // Rank 1 never calls: rank 0 waits at most the timeout.
    auto start = std::chrono::steady_clock::now();
    auto ok = ring_allreduce(*ring.groups[0], data);
    ASSERT_FALSE(ok);
    EXPECT_THAT(ok.error().message(), HasSubstr("replica 1 (worker0/cpu/reducer1)"));
    EXPECT_LT(std::chrono::steady_clock::now() - start, 4s);
  }
}

// ---- across processes -------------------------------------------------------

/// This rank's input(rank, count), on the heap or in a g.buffer().
tensor input_in(reducer_group& g, std::int64_t count, bool from_buffer) {
  auto data = input(g.rank(), count);
  if (!from_buffer)
    return data;
  auto buffer = g.buffer({count});
  buffer.copy_from(data);
  return buffer;
}

/// Runs the cross-process allreduces as `rank`; "" when every one is right.
/// Allreduces of 4 KiB and 16 MiB, on heap tensors and then on tensors from
/// g.buffer() (in the node's arena on the same-host path, where the peers
/// read them in place: checked by the workspace's counter).
std::string run_allreduces(reducer_group& g) {
  for (bool from_buffer : {false, true})
    for (std::int64_t bytes : {std::int64_t{4} << 10, std::int64_t{16} << 20}) {
      auto count = bytes / 4;
      auto data = input_in(g, count, from_buffer);
      auto* workspace = reducer_group_access::member(g).workspace();
      const auto read_before = workspace ? workspace->read_in_place() : 0;
      auto ok = ring_allreduce(g, data);
      if (!ok)
        return ok.error().message();
      auto got = data.to_vector<float>();
      for (std::int64_t i = 0; i < count; ++i)
        if (std::abs(got[static_cast<std::size_t>(i)] - reference(g.size(), i)) > 1e-5 * reference(g.size(), i))
          return "wrong element " + std::to_string(i) + " of " + std::to_string(count);
      if (workspace) {
        const auto read = workspace->read_in_place() - read_before;
        if (read != (from_buffer ? g.size() - 1 : 0))
          return fmt::format("{} peers' tensors read in place ({} bytes, {})", read, bytes,
                             from_buffer ? "buffer()" : "heap");
      }
    }
  return "";
}

/// All-gathers into outputs in the node's arena on even ranks and on the
/// heap on odd ones (both paths, mixed in one collective), then one
/// all_gather() and two broadcasts; every piece must arrive bit for bit, and an arena output
/// must have been written by the peers (the workspace's counter). Returns ""
/// or what went wrong.
std::string run_all_gathers(reducer_group& g) {
  const auto n = g.size();
  for (std::int64_t count : {std::int64_t{1}, std::int64_t{1000}, std::int64_t{3} << 18}) {
    auto out = g.rank() % 2 == 0 ? g.buffer({count * n}) : tensor::empty({count * n}, dtype::float32);
    auto* workspace = reducer_group_access::member(g).workspace();
    const auto published_before = workspace ? workspace->published_in_place() : 0;
    const auto read_before = workspace ? workspace->read_across_processes() : 0;
    if (auto ok = all_gather_into(g, input(g.rank(), count), out); !ok)
      return ok.error().message();
    for (std::uint32_t r = 0; r < n; ++r)
      if (!bitwise_equal(out.slice(0, r * count, (r + 1) * count).clone(), input(r, count)))
        return fmt::format("rank {}'s piece of {} differs", r, count);
    if (workspace) {
      const auto published = workspace->published_in_place() - published_before;
      if (published != (g.rank() % 2 == 0 ? 1u : 0u))
        return fmt::format("{} all-gathers into this rank's {} output", published,
                           g.rank() % 2 == 0 ? "arena" : "heap");
      // A heap output reads the peers' pieces of 32 KiB or more from their processes.
      const auto read = workspace->read_across_processes() - read_before;
      if ((read > 0) != (g.rank() % 2 == 1 && count * 4 >= std::int64_t{same_host_workspace::single_copy_min_bytes}))
        return fmt::format("{} pieces read from the peers' memory into this rank's {} output", read,
                           g.rank() % 2 == 0 ? "arena" : "heap");
    }
  }
  // all_gather() allocates its output with buffer(): on the same-host path
  // every rank's lies in its arena and is written by the peers.
  {
    constexpr std::int64_t count = 5000;
    auto* workspace = reducer_group_access::member(g).workspace();
    const auto published_before = workspace ? workspace->published_in_place() : 0;
    auto all = all_gather(g, input(g.rank(), count));
    if (!all)
      return all.error().message();
    for (std::uint32_t r = 0; r < n; ++r)
      if (!bitwise_equal(all->slice(0, r * count, (r + 1) * count).clone(), input(r, count)))
        return fmt::format("rank {}'s piece of all_gather() differs", r);
    if (workspace && workspace->published_in_place() - published_before != 1)
      return "all_gather()'s output was not written in place by the peers";
  }
  // Broadcasts from the last rank, over several passes, its tensor on the
  // heap and then from buffer() (read where it lies: the workspace's counter).
  for (bool from_buffer : {false, true})
    for (std::int64_t count : {std::int64_t{7}, std::int64_t{3} << 18}) {
      auto data = input_in(g, count, from_buffer);
      auto* workspace = reducer_group_access::member(g).workspace();
      const auto published_before = workspace ? workspace->published_in_place() : 0;
      if (auto ok = broadcast(g, data, {.root = n - 1}); !ok)
        return ok.error().message();
      if (!bitwise_equal(data, input(n - 1, count)))
        return fmt::format("the broadcast of {} differs from rank {}'s values", count, n - 1);
      const bool read_in_place = from_buffer && g.rank() == n - 1;
      if (workspace && workspace->published_in_place() - published_before != (read_in_place ? 1u : 0u))
        return fmt::format("the root's {} tensor of {} was {}read in place", from_buffer ? "buffer()" : "heap",
                           count, read_in_place ? "not " : "");
    }
  auto wrong = tensor::empty({3}, dtype::float32);
  auto refused = all_gather_into(g, input(g.rank(), 2), wrong);
  if (refused || refused.error().message().find("want float32 of " + std::to_string(2 * n)) == std::string::npos)
    return "an output of the wrong size was " + (refused ? std::string("accepted") : refused.error().message());
  return "";
}

int run_child(int argc, char** argv) {
  auto options = actors::node_options::from(argc, argv);
  if (!options)
    return 2;
  auto started = actors::node::start(*options);
  if (!started) {
    std::printf("START ERROR %s\n", started.error().message().c_str());
    return 3;
  }
  {
    auto n = (*started)->options().world_size;
    const std::string_view mode = argv[1];
    auto group = reducer_group::join(**started, {.rank = (*started)->rank(), .places = places_for(n),
                                                 .timeout = 10000ms,
                                                 .same_host = mode.ends_with("-ring") || mode.ends_with("-halving")
                                                                  ? ring_path
                                                                  : shared_path,
                                                 .messages = mode.ends_with("-halving")
                                                                 ? halving
                                                                 : reducer_group_options{}.messages});
    if (!group) {
      std::printf("JOIN ERROR %s\n", group.error().message().c_str());
      std::fflush(stdout);
    } else {
      std::printf("READY\n");
      std::fflush(stdout);
      if (mode.starts_with("--reducer-child")) {
        auto result = run_allreduces(*group);
        if (result.empty())
          result = run_all_gathers(*group);
        std::printf("%s\n", result.empty() ? "COLLECTIVES OK" : ("COLLECTIVES FAILED " + result).c_str());
        std::fflush(stdout);
      }
      char byte;
      while (read(0, &byte, 1) > 0) {
      }
    }
  }
  (*started)->stop();
  return 0;
}

class CrossProcess : public ::testing::TestWithParam<std::uint32_t> {};

/// Every rank's allreduces and all-gathers across `n` processes, on `path`
/// (over messages by `messages` where that is the ring: the default, or
/// halving-doubling).
void collectives_across_processes(std::uint32_t n, same_host_algorithm path,
                                  std::optional<message_algorithm> messages = std::nullopt) {
  cluster c;
  const char* mode = path == shared_path ? "--reducer-child"
                     : messages == halving ? "--reducer-child-halving"
                                           : "--reducer-child-ring";
  ASSERT_NO_FATAL_FAILURE(start_cluster(c, n, mode));
  auto group = reducer_group::join(
      *c.coordinator,
      {.rank = 0, .places = places_for(n), .timeout = 10000ms, .same_host = path, .messages = messages});
  ASSERT_TRUE(group) << group.error().message() << "\n" << c.workers[0].output() << "\n" << c.workers.back().output();
  // Processes on one host (the same boot and /dev/shm) share memory unless told not to.
  EXPECT_EQ(group->shares_memory(), path == shared_path);
  EXPECT_EQ(run_allreduces(*group), "");
  EXPECT_EQ(run_all_gathers(*group), "");
  for (auto& w : c.workers)
    EXPECT_TRUE(w.wait_for("COLLECTIVES OK", 20s)) << w.output();
}

TEST_P(CrossProcess, CollectivesCorrectOnEveryRank) { collectives_across_processes(GetParam(), shared_path); }

TEST_P(CrossProcess, RingCollectivesCorrectOnEveryRank) { collectives_across_processes(GetParam(), ring_path); }

INSTANTIATE_TEST_SUITE_P(Ring, CrossProcess, ::testing::Values(2u, 3u));

TEST(CrossProcessHalvingDoubling, CollectivesCorrectOnEveryRankOf4) {
  collectives_across_processes(4, ring_path, halving);
}

class KilledPeer : public ::testing::TestWithParam<same_host_algorithm> {};

TEST_P(KilledPeer, FailsNamingIt) {
  const auto path = GetParam();
  cluster c;
  ASSERT_NO_FATAL_FAILURE(start_cluster(c, 2, path == ring_path ? "--reducer-idle-ring" : "--reducer-idle"));
  auto group = reducer_group::join(*c.coordinator,
                                   {.rank = 0, .places = places_for(2), .timeout = 3000ms, .same_host = path});
  ASSERT_TRUE(group) << group.error().message();
  EXPECT_EQ(group->shares_memory(), path == shared_path);
  ASSERT_TRUE(c.workers[0].wait_for("READY", 10s)) << c.workers[0].output();
  c.workers[0].signal(SIGKILL);
  auto data = input(0, 1 << 16);
  auto start = std::chrono::steady_clock::now();
  auto ok = ring_allreduce(*group, data);
  ASSERT_FALSE(ok);
  EXPECT_THAT(ok.error().message(), HasSubstr("replica 1 (worker1/cpu/reducer1)"));
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
}

INSTANTIATE_TEST_SUITE_P(CrossProcess, KilledPeer, ::testing::Values(ring_path, shared_path));

} // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::string_view(argv[1]).starts_with("--reducer-"))
    return run_child(argc, argv);
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
