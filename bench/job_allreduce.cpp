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
// warm-ups; the median is printed), --json, --chunk-kib and --min-chunks
// (the chunking, reducer_group_options). The algorithm is the job's:
// --troupe.collectives=ring|halving-doubling|automatic (automatic unless
// given; bench/links.sh asks for the ring). On one host the messages
// run too (never the shared-memory path), so one host measures what hosts
// would. Exit 1 when any element is wrong.
#include <algorithm>
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
    fmt::print("# {} allreduce, {} ranks, median of {} after 2 warm-ups\n{:>12} {:>12} {:>12} {:>10} {:>10} {:>8}\n",
               algorithm, n, iterations, "size(B)", "count", "time(us)", "algbw", "busbw", "#wrong");
  for (std::int64_t kib = min_kib; kib <= max_kib; kib *= 4) {
    const std::int64_t count = kib * 1024 / 4;
    auto data = tensor::empty({count}, dtype::float32);
    std::vector<double> times;
    std::int64_t wrong = 0;
    for (int i = 0; i < iterations + 2; ++i) {
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
    std::sort(times.begin(), times.end());
    const double t = times[times.size() / 2];
    const double bytes = double(count) * 4;
    const double algbw = bytes / t / 1e9;
    const double busbw = algbw * 2.0 * (n - 1) / n;
    if (!job.is_driver())
      continue;
    if (json)
      fmt::print("{{\"bench\":\"job_allreduce\",\"algorithm\":\"{}\",\"ranks\":{},\"bytes\":{},\"time_us\":{:.1f},"
                 "\"algbw_gbs\":{:.4f},"
                 "\"busbw_gbs\":{:.4f},\"wrong\":{}}}\n",
                 algorithm, n, count * 4, t * 1e6, algbw, busbw, wrong);
    else
      fmt::print("{:>12} {:>12} {:>12.1f} {:>10.3f} {:>10.3f} {:>8}\n", count * 4, count, t * 1e6, algbw, busbw,
                 wrong ? fmt::format("{} WRONG", wrong) : "0");
    std::fflush(stdout);
  }
  return job.finish(any_wrong ? 1 : 0);
}
