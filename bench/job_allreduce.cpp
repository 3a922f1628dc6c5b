// Float32 sum allreduce over messages (the ring, or halving-doubling), across whatever ranks the launcher
// started (one host, or many over ssh: bench/links.sh runs it on namespace
// hosts behind shaped links), in the nccl-tests manner: size, count, time,
// algbw, busbw = 2(n-1)/n * bytes / time, and #wrong from checking every
// element against the expected sum. Unlike build/bench/allreduce (rank 0
// forks the others on 127.0.0.1) it is an ordinary job, so it runs wherever
// a job runs.
//
//   build/bin/troupe-launch -n 4 --hosts HOSTS -- build/bench/job_allreduce --min-kib=64 --max-kib=65536
//
// Flags: --min-kib, --max-kib (sizes step x4), --iterations (timed, after 2
// warm-ups; time and busbw are their mean, as nccl-tests', and the JSON also
// gives the median), --min-timed-kib (more iterations for sizes that would
// reduce less than this in all), --json, --chunk-kib and --min-chunks
// (the chunking, reducer_group_options). The algorithm is the job's:
// --troupe.collectives=ring|halving-doubling|automatic (automatic unless
// given; bench/links.sh asks for the ring). On one host the messages
// run too (never the shared-memory path), so one host measures what hosts
// would. Exit 1 when any element is wrong.
#include <algorithm>
#include <numeric>
#include <vector>

#include <fmt/format.h>

#include "report.hpp"
#include "troupe/job.hpp"
#include "troupe/parallel/collectives.hpp"

using namespace troupe;
using namespace troupe::parallel;

int main(int argc, char** argv) {
  job job(argc, argv);
  const auto min_kib = job.flag("min-kib", 64, 1, 1 << 20);
  const auto max_kib = job.flag("max-kib", 65536, 1, 1 << 20);
  const auto iterations = job.flag("iterations", 5, 1, 1000);
  // Small sizes run more iterations, until this much has been reduced: a
  // token bucket's burst (tbf, 128 KiB at 1 Gbit/s) would otherwise carry
  // a share of the few that run.
  const auto min_timed_kib = job.flag("min-timed-kib", 0, 0, 1 << 20);
  const bool json = job.flag("json", "no", {"no", "yes"}) == "yes";
  const reducer_group_options defaults;
  const auto chunk_kib = job.flag("chunk-kib", static_cast<std::int64_t>(defaults.chunk_bytes >> 10), 1, 1 << 20);
  const auto min_chunks = job.flag("min-chunks", defaults.min_chunks, 1, 1024);
  if (min_kib > max_kib)
    job.reject(fmt::format("--min-kib={} is above --max-kib={}", min_kib, max_kib));
  job.start();
  // A minute per chunk: a 64 MiB segment over a 1 Gbit/s link takes ~0.5 s,
  // and 8 ranks on 2 cores wait on each other.
  auto group = job.must(reducer_group::join(
    job, {.chunk_bytes = static_cast<std::size_t>(chunk_kib) << 10, .min_chunks = static_cast<std::uint32_t>(min_chunks),
          .timeout = std::chrono::milliseconds(60000), .same_host = same_host_algorithm::ring}));
  const auto n = group.size();
  const auto algorithm = name_of(group.options().messages.value());
  const float want = static_cast<float>(n * (n + 1) / 2);
  std::int64_t any_wrong = 0;
  if (job.is_driver() && !json)
    fmt::print("# {} allreduce, {} ranks, mean of {} after 2 warm-ups\n{:>12} {:>12} {:>12} {:>10} {:>10} {:>8}\n",
               algorithm, n, iterations, "size(B)", "count", "time(us)", "algbw", "busbw", "#wrong");
  for (std::int64_t kib = min_kib; kib <= max_kib; kib *= 4) {
    const std::int64_t count = kib * 1024 / 4;
    auto data = tensor::empty({count}, dtype::float32);
    std::vector<double> times;
    std::int64_t wrong = 0;
    const auto timed = std::max(iterations, std::min<std::int64_t>((min_timed_kib + kib - 1) / kib, 1000));
    for (std::int64_t i = 0; i < timed + 2; ++i) {
      data.fill(group.rank() + 1.0);
      // Rank 0's clock: the ring cannot finish on one rank before every
      // rank has sent its share, so this times the slowest rank's part too.
      const auto start = bench::now_seconds();
      job.must(ring_allreduce(group, data), fmt::format("allreduce of {} KiB", kib));
      const auto elapsed = bench::now_seconds() - start;
      if (i >= 2)
        times.push_back(elapsed);
      const float* p = data.data<float>();
      for (std::int64_t j = 0; j < count; ++j)
        wrong += p[j] != want;
    }
    any_wrong += wrong;
    // The mean, not the median: behind a token bucket (tbf, bench/links.sh)
    // an iteration that finds tokens left runs at the wire's speed, so the
    // median of a few can exceed the link's rate; the mean cannot.
    const double t = std::accumulate(times.begin(), times.end(), 0.0) / double(times.size());
    std::sort(times.begin(), times.end());
    const double median = times[times.size() / 2];
    const double bytes = double(count) * 4;
    const double algbw = bytes / t / 1e9;
    const double busbw = algbw * 2.0 * (n - 1) / n;
    if (!job.is_driver())
      continue;
    if (json)
      fmt::print("{{\"bench\":\"job_allreduce\",\"algorithm\":\"{}\",\"ranks\":{},\"bytes\":{},\"time_us\":{:.1f},"
                 "\"median_us\":{:.1f},\"iterations\":{},\"algbw_gbs\":{:.4f},"
                 "\"busbw_gbs\":{:.4f},\"wrong\":{}}}\n",
                 algorithm, n, count * 4, t * 1e6, median * 1e6, timed, algbw, busbw, wrong);
    else
      fmt::print("{:>12} {:>12} {:>12.1f} {:>10.3f} {:>10.3f} {:>8}\n", count * 4, count, t * 1e6, algbw, busbw,
                 wrong ? fmt::format("{} WRONG", wrong) : "0");
    std::fflush(stdout);
  }
  return job.finish(any_wrong ? 1 : 0);
}
