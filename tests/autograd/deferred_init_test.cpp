// nn::deferred_init: a process that keeps part of a model (a pipeline
// stage) builds the rest without values, and the part it keeps equals an
// eager build's.
#include "troupe/autograd/nn/deferred_init.hpp"

#include <gtest/gtest.h>

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "troupe/autograd/nn/all.hpp"
#include "troupe/tensor/host_allocator.hpp"
#include "troupe/tensor/ops.hpp"

namespace troupe::nn {
namespace {

gpt_config small_gpt() {
  return {.vocab_size = 50, .block_size = 16, .n_layer = 4, .n_head = 4, .n_embd = 32, .seed = 11};
}

/// How many of the pages under `t`'s elements the process holds (mincore).
std::size_t resident_pages(const tensor& t) {
  const auto page = static_cast<std::uintptr_t>(::sysconf(_SC_PAGESIZE));
  auto begin = reinterpret_cast<std::uintptr_t>(t.raw_data()) / page * page;
  auto end = reinterpret_cast<std::uintptr_t>(t.raw_data()) + t.nbytes();
  std::vector<unsigned char> held((end - begin + page - 1) / page);
  EXPECT_EQ(::mincore(reinterpret_cast<void*>(begin), end - begin, held.data()), 0);
  std::size_t count = 0;
  for (auto h : held)
    count += h & 1;
  return count;
}

TEST(DeferredInit, TheKeptPartEqualsAnEagerBuildAndTheRestStaysZero) {
  auto eager = std::make_shared<gpt>(small_gpt());
  deferred_init deferred;
  auto lazy = std::make_shared<gpt>(small_gpt());
  const auto recorded = deferred.pending();
  EXPECT_EQ(recorded, lazy->parameters().size());
  auto kept = lazy->slice(1, 3); // blocks 0 and 1
  const auto made = deferred.materialize(*kept);
  EXPECT_EQ(made, kept->parameters().size());
  EXPECT_EQ(deferred.pending(), recorded - made);
  EXPECT_EQ(deferred.materialize(*kept), 0u) << "each draw is made once";

  auto eager_state = eager->state_dict();
  auto lazy_state = lazy->state_dict();
  ASSERT_EQ(eager_state.size(), lazy_state.size());
  std::size_t compared = 0;
  for (std::size_t i = 0; i < eager_state.size(); ++i) {
    const auto& [name, value] = lazy_state[i];
    ASSERT_EQ(name, eager_state[i].first);
    const bool in_kept = name.starts_with("1.") || name.starts_with("2.");
    if (in_kept) {
      EXPECT_TRUE(troupe::allclose(value, eager_state[i].second, 0.0, 0.0)) << name << " differs from the eager build";
      ++compared;
    } else if (name.ends_with("weight") && name.find("ln") == std::string::npos) {
      EXPECT_EQ(troupe::max_all(troupe::abs(value)).item(), 0.0) << name << " was drawn";
    }
  }
  EXPECT_GT(compared, 8u);
}

TEST(DeferredInit, DroppedLayersTakeNoMemory) {
  host_allocator::instance().release_cached(); // fresh mappings, not reused blocks
  std::shared_ptr<linear> dropped, kept;
  {
    deferred_init deferred;
    dropped = std::make_shared<linear>(1024, 1024, 3); // 4 MiB of weight
    kept = std::make_shared<linear>(1024, 1024, 4);
    deferred.materialize(*kept);
  }
  EXPECT_EQ(resident_pages(dropped->weight().data()), 0u) << "the dropped layer's zeros were written";
  EXPECT_GT(resident_pages(kept->weight().data()), 0u);
  auto eager = linear(1024, 1024, 4);
  EXPECT_TRUE(troupe::allclose(kept->weight().data(), eager.weight().data(), 0.0, 0.0));
}

TEST(DeferredInit, LoadedParametersKeepWhatWasLoaded) {
  auto source = std::make_shared<gpt>(small_gpt());
  auto loaded_state = source->state_dict();
  for (auto& [name, value] : loaded_state)
    value = value + 1.0;
  deferred_init deferred;
  auto model = std::make_shared<gpt>(small_gpt());
  ASSERT_TRUE(model->load_state_dict(loaded_state));
  deferred.materialize(*model);
  for (const auto& [name, value] : model->state_dict()) {
    auto expected = std::find_if(loaded_state.begin(), loaded_state.end(), [&](auto& e) { return e.first == name; });
    EXPECT_TRUE(troupe::allclose(value, expected->second, 0.0, 0.0)) << name << " was drawn over what was loaded";
  }
}

TEST(DeferredInit, OnlyTheThreadAndScopeThatDeferDefer) {
  EXPECT_EQ(deferred_init::current(), nullptr);
  {
    deferred_init outer;
    {
      deferred_init inner;
      EXPECT_EQ(deferred_init::current(), &inner);
      auto layer = linear(4, 4, 1);
      EXPECT_EQ(inner.pending(), 2u);
      EXPECT_EQ(outer.pending(), 0u);
    }
    EXPECT_EQ(deferred_init::current(), &outer);
  }
  EXPECT_EQ(deferred_init::current(), nullptr);
  auto drawn = linear(4, 4, 1);
  EXPECT_GT(troupe::max_all(troupe::abs(drawn.weight().data())).item(), 0.0);
}

} // namespace
} // namespace troupe::nn
