// Intra-op threads: an op split over two threads gives bitwise the result of
// one thread (every output element is computed by the same code whichever
// range holds it), the split really runs on two threads, and bad counts are
// refused. Sizes are well above the grains, so every op here is split.
#include <omp.h>

#include <algorithm>
#include <functional>
#include <mutex>
#include <set>
#include <thread>

#include "test_util.hpp"
#include "troupe/tensor/backend.hpp"
#include "troupe/tensor/intra_op_threads.hpp"
#include "troupe/tensor/parallel_for.hpp"

namespace troupe {
namespace {

using ::testing::HasSubstr;

/// Sets the count for one test and puts 1 back, whatever the test does.
class with_threads {
public:
  explicit with_threads(int n) { set_intra_op_threads(n); }
  with_threads(const with_threads&) = delete;
  with_threads& operator=(const with_threads&) = delete;
  ~with_threads() { set_intra_op_threads(1); }
};

/// What `op` gives with one thread and with two, bitwise equal.
void expect_same_with_two_threads(const std::function<std::vector<tensor>()>& op, const char* what) {
  std::vector<tensor> one;
  {
    with_threads scope(1);
    one = op();
  }
  std::vector<tensor> two;
  {
    with_threads scope(2);
    two = op();
  }
  ASSERT_EQ(one.size(), two.size()) << what;
  for (std::size_t i = 0; i < one.size(); ++i)
    EXPECT_EQ(test::values(one[i]), test::values(two[i])) << what << ", result " << i;
}

TEST(IntraOpThreads, OneUnlessSetAndAtLeastOne) {
  EXPECT_EQ(intra_op_threads(), 1);
  {
    with_threads scope(3);
    EXPECT_EQ(intra_op_threads(), 3);
  }
  EXPECT_EQ(intra_op_threads(), 1);
  try {
    set_intra_op_threads(0);
    FAIL() << "0 threads accepted";
  } catch (const usage_error& e) {
    EXPECT_THAT(e.what(), HasSubstr("set_intra_op_threads: 0 threads"));
  }
  EXPECT_EQ(intra_op_threads(), 1) << "a refused count changes nothing";
}

TEST(IntraOpThreads, ALongLoopRunsOnTwoThreadsInAlignedRangesThatTileIt) {
  with_threads scope(2);
  constexpr std::int64_t count = 100'003;
  std::vector<int> covered(count, 0);
  std::mutex lock;
  std::set<std::thread::id> threads;
  std::vector<std::int64_t> starts;
  detail::parallel_for(
      count, 1000,
      [&](std::int64_t begin, std::int64_t end) {
        std::lock_guard guard(lock);
        threads.insert(std::this_thread::get_id());
        starts.push_back(begin);
        for (auto i = begin; i < end; ++i)
          ++covered[static_cast<std::size_t>(i)];
      },
      64);
  EXPECT_EQ(threads.size(), 2u);
  for (auto start : starts)
    EXPECT_EQ(start % 64, 0) << "a range starting at " << start;
  EXPECT_EQ(std::count(covered.begin(), covered.end(), 1), count) << "every element exactly once";
}

TEST(IntraOpThreads, AShortLoopOrOneThreadStaysOnTheCaller) {
  const auto caller = std::this_thread::get_id();
  std::set<std::thread::id> seen;
  auto record = [&](std::int64_t, std::int64_t) { seen.insert(std::this_thread::get_id()); };
  detail::parallel_for(1'000'000, 1000, record); // one thread set
  {
    with_threads scope(2);
    detail::parallel_for(1999, 1000, record); // under two grains
  }
  EXPECT_EQ(seen, std::set<std::thread::id>{caller});
}

TEST(IntraOpThreads, AnExceptionInARangeReachesTheCaller) {
  with_threads scope(2);
  EXPECT_THROW(detail::parallel_for(100'000, 1000,
                                    [](std::int64_t begin, std::int64_t) {
                                      if (begin > 0)
                                        throw usage_error("second range");
                                    }),
               usage_error);
}

TEST(IntraOpThreads, ElementwiseOpsGiveTheSameBitsOnTwoThreads) {
  for (auto type : {dtype::float32, dtype::float64}) {
    const auto a = test::sample({300, 701}, 1, type) * 4.0;
    const auto b = test::sample({300, 701}, 2, type);
    expect_same_with_two_threads(
        [&] {
          return std::vector<tensor>{add(a, b), mul(a, b), div(a, add(b, 2.0)), exp(a), tanh(a), sigmoid(a),
                                     gelu(a), gelu(a, gelu_approximation::tanh), gelu_backward(b, a),
                                     gelu_backward(b, a, gelu_approximation::tanh), relu(a)};
        },
        type == dtype::float32 ? "float32 elementwise" : "float64 elementwise");
  }
}

TEST(IntraOpThreads, RowKernelsGiveTheSameBitsOnTwoThreads) {
  for (auto type : {dtype::float32, dtype::float64}) {
    // 8 matrices of 96 queries x 96 keys: ranges of whole matrices.
    const auto scores = test::sample({8, 96, 96}, 3, type) * 6.0;
    const auto grad = test::sample({8, 96, 96}, 4, type);
    const auto rows = test::sample({2000, 129}, 5, type) * 3.0;
    const auto row_grad = test::sample({2000, 129}, 6, type);
    const auto weight = test::sample({129}, 7, type);
    const auto bias = test::sample({129}, 8, type);
    generator gen{9, 0};
    const auto targets = randint({2000}, gen, 0, 129);
    expect_same_with_two_threads(
        [&] {
          auto sm = softmax(rows, 1);
          auto lsm = log_softmax(rows, 1);
          auto causal = causal_softmax(scores, 0.125);
          auto ln = layer_norm(rows, weight, bias);
          auto ce = cross_entropy(rows, targets);
          return std::vector<tensor>{sm,
                                     softmax_backward(row_grad, sm, 1),
                                     lsm,
                                     log_softmax_backward(row_grad, lsm, 1),
                                     causal,
                                     causal_softmax_backward(grad, causal, 0.125),
                                     ln.output,
                                     ln.mean,
                                     ln.rstd,
                                     ce.loss,
                                     ce.log_sum_exp,
                                     cross_entropy_backward(tensor::scalar(1.0, type), rows, targets,
                                                            ce.log_sum_exp)};
        },
        type == dtype::float32 ? "float32 rows" : "float64 rows");
  }
}

// im2col and col2im split channels, pooling and its gradient split planes:
// the same bits on two threads. (A convolution's GEMMs may sum in another
// order on two threads; MatmulOnTwoThreadsAgreesWithinRounding covers them.)
TEST(IntraOpThreads, ConvolutionAndPoolingKernelsGiveTheSameBitsOnTwoThreads) {
  for (auto type : {dtype::float32, dtype::float64}) {
    const auto image = test::sample({16, 40, 30}, 11, type);
    const conv_geometry g{.channels = 16, .height = 40, .width = 30, .kernel_h = 3, .kernel_w = 3,
                          .stride = 1, .padding = 1, .out_h = 40, .out_w = 30};
    const auto maps = test::sample({16, 16, 40, 30}, 12, type); // 256 planes: enough to split
    expect_same_with_two_threads(
        [&] {
          auto& cpu = backend_for(device::cpu(), "test");
          auto cols = tensor::empty({16 * 9, 40 * 30}, type);
          cpu.im2col(image, g, cols);
          auto back = tensor::zeros({16, 40, 30}, type);
          cpu.col2im(cols, g, back);
          auto pooled = max_pool2d(maps, {2, 2});
          auto overlapping = max_pool2d(maps, {3, 1});
          auto grad_maps = max_pool2d_backward(pooled.output, pooled.indices, maps.shape());
          return std::vector<tensor>{cols, back, pooled.output, pooled.indices, overlapping.output,
                                     overlapping.indices, grad_maps};
        },
        type == dtype::float32 ? "float32 convolution and pooling" : "float64 convolution and pooling");
  }
}

TEST(IntraOpThreads, MatmulOnTwoThreadsAgreesWithinRounding) {
  const auto a = test::sample({256, 512}, 10, dtype::float32);
  const auto b = test::sample({512, 384}, 11, dtype::float32);
  tensor one;
  {
    with_threads scope(1);
    one = matmul(a, b);
  }
  tensor two;
  {
    with_threads scope(2);
    two = matmul(a, b);
  }
  test::expect_close(two, test::values(one), 1e-5);
}

} // namespace
} // namespace troupe
