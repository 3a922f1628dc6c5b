// troupe-launch: the command lines it plans (hosts file, ssh quoting; never
// run here), and the real tool on this host: environment, prefixed output,
// stopping everything when a rank fails or on SIGINT, bad arguments.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/stat.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

#include <fmt/format.h>

#include "process_support.hpp"
#include "troupe/actors/launcher.hpp"

using namespace std::chrono_literals;
using namespace troupe;
using namespace troupe::actors;
using troupe::test::child_process;

namespace {

const std::string launcher = std::string(TROUPE_BINARY_DIR) + "/bin/troupe-launch";

child_process launch(std::vector<std::string> args) {
  return child_process::start(launcher, args,
                              {"TROUPE_COORDINATOR=", "TROUPE_RANK=", "TROUPE_WORLD_SIZE=", "TROUPE_NODE_NAME=",
                               "TROUPE_RESTART="});
}

// A scratch directory removed at the end of the test.
struct scratch_dir {
  std::filesystem::path path;
  scratch_dir() {
    path = std::filesystem::temp_directory_path() / ("troupe_launcher_test_" + std::to_string(getpid()));
    std::filesystem::create_directories(path);
  }
  ~scratch_dir() { std::filesystem::remove_all(path); }
};

// Whether `pid` has exited within `timeout` (a remote rank is stopped by
// its own watcher, a moment after the launcher has exited).
bool gone_within(pid_t pid, std::chrono::milliseconds timeout) {
  for (auto end = std::chrono::steady_clock::now() + timeout;; std::this_thread::sleep_for(50ms)) {
    if (kill(pid, 0) != 0 && errno == ESRCH)
      return true;
    if (std::chrono::steady_clock::now() >= end)
      return false;
  }
}

// The pids the ranks wrote, all of which must have exited.
void expect_all_gone(const std::filesystem::path& dir, int ranks) {
  for (int rank = 0; rank < ranks; ++rank) {
    std::ifstream in(dir / ("pid." + std::to_string(rank)));
    pid_t pid = 0;
    if (!(in >> pid))
      continue; // the rank was stopped before it wrote its pid
    EXPECT_TRUE(kill(pid, 0) != 0 && errno == ESRCH) << "rank " << rank << " (pid " << pid << ") is still running";
    if (kill(pid, 0) == 0)
      kill(pid, SIGKILL);
  }
}

// A rank's program: `body` for /bin/sh, after it has recorded its pid in
// `dir` for expect_all_gone.
std::vector<std::string> rank_shell(const scratch_dir& dir, const std::string& body) {
  return {"/bin/sh", "-c", "echo $$ > " + dir.path.string() + "/pid.$TROUPE_RANK; " + body};
}

std::vector<std::string> concat(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// The launcher's exit status once it has exited (within `timeout`); -1 while
// it still runs or when a signal ended it.
int exit_status(child_process& run, std::chrono::milliseconds timeout = 30s) {
  auto status = run.exited(timeout);
  return status && WIFEXITED(*status) ? WEXITSTATUS(*status) : -1;
}

} // namespace

TEST(LaunchPlan, LocalRanksGetTheRendezvousVariables) {
  launch_request request;
  request.ranks = 3;
  request.port = 4242;
  request.program = {"./train", "--epochs", "2"};
  auto plan = plan_launch(request);
  ASSERT_TRUE(plan) << plan.error().message();
  ASSERT_EQ(plan->size(), 3u);
  auto& rank2 = (*plan)[2];
  EXPECT_FALSE(rank2.remote);
  EXPECT_EQ(rank2.node_name, "worker2");
  EXPECT_EQ(rank2.env, (std::vector<std::string>{"TROUPE_COORDINATOR=127.0.0.1:4242", "TROUPE_RANK=2",
                                                 "TROUPE_WORLD_SIZE=3", "TROUPE_NODE_NAME=worker2",
                                                 "TROUPE_RESTART=0"}));
  EXPECT_EQ(rank2.argv, request.program);
  request.restart = 2; // troupe-launch --restarts, the third run
  EXPECT_EQ((*plan_launch(request))[2].env.back(), "TROUPE_RESTART=2");
  request.job_token = "s3cret";
  EXPECT_EQ((*plan_launch(request))[1].env.back(), "TROUPE_JOB_TOKEN=s3cret");
}

TEST(LaunchPlan, RemoteRanksRunOverSshWithQuotedCommands) {
  auto hosts = parse_hosts("# cluster\ngpu-a slots=2\n\ngpu-b   # one slot\nlocalhost slots=4\n", "hosts");
  ASSERT_TRUE(hosts) << hosts.error().message();
  EXPECT_EQ(*hosts, (std::vector<host_slots>{{"gpu-a", 2}, {"gpu-b", 1}, {"localhost", 4}}));
  launch_request request;
  request.ranks = 4;
  request.port = 7000;
  request.hosts = *hosts;
  request.working_directory = "/home/me/my job";
  request.program = {"./train", "a b", "it's"};
  request.job_token = "s3cret";
  request.ssh = {"ssh", "-F", "cluster/ssh_config"};
  request.forwarded_env = {"UCX_TLS=tcp"};
  request.remote_grace_s = 0.5;
  auto plan = plan_launch(request);
  ASSERT_TRUE(plan) << plan.error().message();
  auto& rank1 = (*plan)[1];
  EXPECT_TRUE(rank1.remote);
  EXPECT_EQ(rank1.node_name, "gpu-a-1");
  ASSERT_EQ(rank1.argv.size(), 8u);
  EXPECT_EQ(std::vector<std::string>(rank1.argv.begin(), rank1.argv.end() - 1),
            (std::vector<std::string>{"ssh", "-F", "cluster/ssh_config", "-o", "BatchMode=yes", "gpu-a", "--"}));
  // The remote shell runs the rank under the script that stops it when ssh's
  // input ends, with 5 tenths of a second of grace; the forwarded variables
  // come first so that the rendezvous variables win.
  const auto& line = rank1.argv.back();
  EXPECT_TRUE(line.starts_with("cd '/home/me/my job' && exec sh -c 'IFS= read -r token")) << line;
  EXPECT_TRUE(line.ends_with("' remote-rank 5 env UCX_TLS=tcp TROUPE_COORDINATOR=gpu-a:7000 TROUPE_RANK=1 "
                             "TROUPE_WORLD_SIZE=4 TROUPE_NODE_NAME=gpu-a-1 TROUPE_RESTART=0 ./train 'a b' 'it'\\''s'"))
    << line;
  // The token travels on ssh's input, never on a command line.
  EXPECT_EQ(line.find("s3cret"), std::string::npos) << line;
  EXPECT_EQ(rank1.stdin_text, "s3cret\n");
  EXPECT_EQ((*plan)[2].node_name, "gpu-b");
  // A localhost slot runs directly, without ssh.
  EXPECT_FALSE((*plan)[3].remote);
  EXPECT_EQ((*plan)[3].argv, request.program);
  EXPECT_EQ((*plan)[3].node_name, "localhost");
  EXPECT_EQ((*plan)[3].env.back(), "TROUPE_JOB_TOKEN=s3cret");
}

TEST(LaunchPlan, RemoteRanksGetTheLaunchersTroupeAndUcxVariablesButNotItsRendezvous) {
  const environment env{{"UCX_TLS", "tcp"},        {"TROUPE_TRACE_DIR", "/tmp/t"}, {"TROUPE_RANK", "3"},
                        {"TROUPE_JOB_TOKEN", "x"}, {"OPENBLAS_NUM_THREADS", "1"}, {"HOME", "/root"},
                        {"OMP_NUM_THREADS", "1"},  {"TROUPE_COORDINATOR", "a:1"}};
  EXPECT_EQ(forwarded_variables(env), (std::vector<std::string>{"OMP_NUM_THREADS=1", "OPENBLAS_NUM_THREADS=1",
                                                                "TROUPE_TRACE_DIR=/tmp/t", "UCX_TLS=tcp"}));
}

TEST(LaunchPlan, BadRequestsAndHostsFilesAreClearErrors) {
  EXPECT_EQ(parse_hosts("a slots=0\n", "h").error().message(), "h:1: slots=\"0\" is not a positive integer");
  EXPECT_EQ(parse_hosts("a\nb cores=2\n", "h").error().message(), "h:2: \"b cores=2\" is not `host [slots=N]`");
  EXPECT_EQ(parse_hosts("# nothing\n", "h").error().message(), "h: no hosts listed");
  launch_request request;
  request.ranks = 3;
  request.hosts = {{"a", 2}};
  request.program = {"x"};
  EXPECT_EQ(plan_launch(request).error().message(), "3 ranks requested but the hosts file has only 2 slots");
  request.program.clear();
  EXPECT_EQ(plan_launch(request).error().message(), "no program to launch (put it after --)");
  EXPECT_EQ(shell_quote("plain/path-1.x"), "plain/path-1.x");
  EXPECT_EQ(shell_quote(""), "''");
  EXPECT_EQ(shell_quote("$HOME; rm"), "'$HOME; rm'");
}

TEST(Launcher, EveryRankGetsItsVariablesAndPrefixedOutput) {
  auto run = launch({"-n", "3", "--port", "4999", "--", "/bin/sh", "-c",
                     "echo \"env $TROUPE_RANK $TROUPE_WORLD_SIZE $TROUPE_NODE_NAME $TROUPE_COORDINATOR\"; "
                     "echo to-stderr >&2; printf 'no newline'"});
  auto status = run.exited(20s);
  ASSERT_TRUE(status) << run.output();
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << run.output();
  auto& out = run.output();
  for (int rank = 0; rank < 3; ++rank) {
    auto r = std::to_string(rank);
    EXPECT_NE(out.find("[" + r + "] env " + r + " 3 worker" + r + " 127.0.0.1:4999\n"), std::string::npos) << out;
    EXPECT_NE(out.find("[" + r + "] to-stderr\n"), std::string::npos) << out;
    EXPECT_NE(out.find("[" + r + "] no newline\n"), std::string::npos) << out;
  }
}

TEST(Launcher, OneFailingRankStopsTheOthersAndIsNamed) {
  scratch_dir dir;
  auto start = std::chrono::steady_clock::now();
  auto run = launch(concat({"-n", "3", "--grace", "2", "--"},
                           rank_shell(dir, "if [ $TROUPE_RANK = 1 ]; then sleep 0.3; exit 3; fi; exec sleep 30")));
  EXPECT_EQ(exit_status(run), 3) << run.output();
  EXPECT_LT(test::seconds_since(start), 10.0);
  EXPECT_NE(run.output().find("troupe-launch: failed: rank 1 (worker1) exited with status 3"), std::string::npos)
    << run.output();
  expect_all_gone(dir.path, 3);
}

TEST(Launcher, AKilledRankIsReportedWithItsSignal) {
  auto run = launch({"-n", "2", "--grace", "1", "--", "/bin/sh", "-c",
                     "if [ $TROUPE_RANK = 0 ]; then kill -9 $$; fi; exec sleep 30"});
  auto status = run.exited(20s);
  ASSERT_TRUE(status) << run.output();
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 128 + SIGKILL) << run.output();
  EXPECT_NE(run.output().find("rank 0 (worker0) was killed by signal 9"), std::string::npos) << run.output();
}

TEST(Launcher, AStoppedRankDoesNotHoldTheJobForTheGracePeriod) {
  scratch_dir dir;
  // Rank 1 stops itself (SIGSTOP) and rank 0 then fails: a stopped process
  // takes SIGTERM only once continued, so without the launcher's SIGCONT it
  // would be killed only after the 10 s grace.
  auto start = std::chrono::steady_clock::now();
  auto run = launch(concat({"-n", "2", "--grace", "10", "--"},
                           rank_shell(dir, "if [ $TROUPE_RANK = 1 ]; then kill -STOP $$; exec sleep 30; fi; "
                                           "sleep 0.5; exit 3")));
  EXPECT_EQ(exit_status(run), 3) << run.output();
  EXPECT_LT(test::seconds_since(start), 3.0) << run.output();
  EXPECT_NE(run.output().find("rank 1 (worker1) stopped: was killed by signal 15"), std::string::npos)
    << run.output();
  expect_all_gone(dir.path, 2);
}

namespace {

// A rank program for the restart tests: prints its run and coordinator,
// records that it ran, and fails (rank 1 with status 3) in the runs before
// `succeed_from`.
std::vector<std::string> failing_until(const scratch_dir& dir, int succeed_from) {
  return rank_shell(dir, "echo \"run $TROUPE_RESTART at $TROUPE_COORDINATOR\"; touch " + dir.path.string() +
                           "/ran.$TROUPE_RESTART.$TROUPE_RANK; if [ $TROUPE_RANK = 1 ] && [ $TROUPE_RESTART -lt " +
                           std::to_string(succeed_from) + " ]; then sleep 0.2; exit 3; fi; sleep 0.5");
}

} // namespace

TEST(Launcher, RestartsAFailedJobAndTellsEachRankItsRun) {
  scratch_dir dir;
  auto run = launch(concat({"-n", "2", "--restarts", "1", "--"}, failing_until(dir, 1)));
  ASSERT_EQ(exit_status(run), 0) << run.output();
  auto& out = run.output();
  EXPECT_NE(out.find("troupe-launch: restarting the job (restart 1 of 1) after: rank 1 (worker1) exited with "
                     "status 3"),
            std::string::npos)
    << out;
  for (int rank = 0; rank < 2; ++rank)
    for (int attempt = 0; attempt < 2; ++attempt)
      EXPECT_TRUE(std::filesystem::exists(dir.path / fmt::format("ran.{}.{}", attempt, rank)))
        << "rank " << rank << " run " << attempt << "\n" << out;
  EXPECT_EQ(out.find("troupe-launch: failed"), std::string::npos) << out;
  // Each run has its own coordinator port: the last one's may be in TIME_WAIT.
  auto coordinator_of = [&](int attempt) {
    const auto prefix = "[0] run " + std::to_string(attempt) + " at ";
    auto at = out.find(prefix);
    return at == std::string::npos ? std::string() : out.substr(at + prefix.size(), out.find('\n', at) - at - prefix.size());
  };
  ASSERT_FALSE(coordinator_of(0).empty()) << out;
  ASSERT_FALSE(coordinator_of(1).empty()) << out;
  EXPECT_NE(coordinator_of(0), coordinator_of(1)) << out;
  expect_all_gone(dir.path, 2);
}

TEST(Launcher, WithoutRestartsAFailedJobFails) {
  scratch_dir dir;
  auto run = launch(concat({"-n", "2", "--restarts", "0", "--"}, failing_until(dir, 1)));
  EXPECT_EQ(exit_status(run), 3) << run.output();
  EXPECT_EQ(run.output().find("restarting"), std::string::npos) << run.output();
  EXPECT_FALSE(std::filesystem::exists(dir.path / "ran.1.0")) << run.output();
}

TEST(Launcher, AJobThatAlwaysFailsRunsOncePlusItsRestartsAndExitsWithItsStatus) {
  scratch_dir dir;
  auto run = launch(concat({"-n", "2", "--restarts", "2", "--"}, failing_until(dir, 1000)));
  EXPECT_EQ(exit_status(run), 3) << run.output();
  auto& out = run.output();
  EXPECT_NE(out.find("(restart 1 of 2)"), std::string::npos) << out;
  EXPECT_NE(out.find("(restart 2 of 2)"), std::string::npos) << out;
  EXPECT_EQ(out.find("(restart 3"), std::string::npos) << out;
  EXPECT_NE(out.find("troupe-launch: failed: rank 1 (worker1) exited with status 3"), std::string::npos) << out;
  for (int attempt = 0; attempt < 3; ++attempt)
    EXPECT_TRUE(std::filesystem::exists(dir.path / fmt::format("ran.{}.1", attempt))) << out;
  EXPECT_FALSE(std::filesystem::exists(dir.path / "ran.3.1")) << out;
}

TEST(Launcher, NeitherTimeoutNorSigintRestarts) {
  auto timed_out = launch({"-n", "2", "--restarts", "3", "--timeout", "0.5", "--", "sleep", "30"});
  EXPECT_EQ(exit_status(timed_out, 10s), 124) << timed_out.output();
  EXPECT_EQ(timed_out.output().find("restarting"), std::string::npos) << timed_out.output();

  auto interrupted = launch({"-n", "2", "--restarts", "3", "--", "/bin/sh", "-c", "echo up; exec sleep 30"});
  ASSERT_TRUE(interrupted.wait_for("[1] up", 10s)) << interrupted.output();
  interrupted.signal(SIGINT);
  EXPECT_EQ(exit_status(interrupted, 10s), 128 + SIGINT) << interrupted.output();
  EXPECT_EQ(interrupted.output().find("restarting"), std::string::npos) << interrupted.output();
}

TEST(Launcher, SigintStopsEverything) {
  scratch_dir dir;
  // Rank 1 ignores SIGTERM: the launcher must escalate to SIGKILL.
  auto run = launch({"-n", "2", "--grace", "0.5", "--", "/bin/sh", "-c",
                     "echo $$ > " + dir.path.string() + "/pid.$TROUPE_RANK; "
                     "if [ $TROUPE_RANK = 1 ]; then trap '' TERM; fi; echo up; while true; do sleep 0.1; done"});
  ASSERT_TRUE(run.wait_for("[0] up", 10s)) << run.output();
  ASSERT_TRUE(run.wait_for("[1] up", 10s)) << run.output();
  run.signal(SIGINT);
  auto status = run.exited(10s);
  ASSERT_TRUE(status) << run.output();
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 128 + SIGINT) << run.output();
  EXPECT_NE(run.output().find("interrupted by Interrupt"), std::string::npos) << run.output();
  expect_all_gone(dir.path, 2);
}

TEST(Launcher, TimeoutStopsTheJob) {
  auto run = launch({"-n", "2", "--timeout", "0.5", "--grace", "0.5", "--", "sleep", "30"});
  auto status = run.exited(10s);
  ASSERT_TRUE(status) << run.output();
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 124) << run.output();
}

TEST(Launcher, BadArgumentsExitWithStatusTwo) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
    {{"--", "true"}, "-n N is required"},
    {{"-n", "zero", "--", "true"}, "-n=\"zero\" is not a positive integer"},
    {{"-n", "2"}, "no program to launch"},
    {{"-n", "2", "--port", "70000", "--", "true"}, "--port=\"70000\" is not in [0, 65535]"},
    {{"-n", "2", "--timeout", "-1", "--", "true"}, "--timeout=\"-1\" is not a positive number of seconds"},
    {{"-n", "2", "--hosts", "/nonexistent", "--", "true"}, "hosts file \"/nonexistent\" cannot be read"},
    {{"-n", "2", "--frobnicate", "--", "true"}, "unknown argument \"--frobnicate\""},
    {{"-n", "2", "--restarts", "-1", "--", "true"}, "--restarts=\"-1\" is not a non-negative integer"},
    {{"-n", "2", "--ssh", " ", "--", "true"}, "--ssh needs a command"},
  };
  for (auto& [args, says] : cases) {
    auto run = launch(args);
    auto status = run.exited(10s);
    ASSERT_TRUE(status);
    EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 2) << run.output();
    EXPECT_NE(run.output().find(says), std::string::npos) << run.output();
  }
}

TEST(Launcher, DryRunPrintsSshCommandsWithoutRunningThem) {
  scratch_dir dir;
  auto hosts = dir.path / "hosts";
  std::ofstream(hosts) << "127.0.0.1\nfar-away-host slots=2\n";
  auto run = launch({"-n", "3", "--hosts", hosts.string(), "--port", "5000", "--dry-run", "--", "./train", "x y"});
  auto status = run.exited(10s);
  ASSERT_TRUE(status);
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << run.output();
  auto& out = run.output();
  EXPECT_NE(out.find("rank 0 on 127.0.0.1: env TROUPE_COORDINATOR="), std::string::npos) << out;
  EXPECT_NE(out.find("rank 2 on far-away-host: ssh -o BatchMode=yes far-away-host -- "), std::string::npos) << out;
  EXPECT_NE(out.find("TROUPE_RANK=2 TROUPE_WORLD_SIZE=3 TROUPE_NODE_NAME=far-away-host-1 TROUPE_RESTART=0 ./train "
                     "'\\''x y'\\''' (the job token on its standard input)"),
            std::string::npos)
    << out;
}

// An "ssh" that runs the remote line on this host, as sshd would (the
// remote-host test with a real sshd is tests/actors/ssh_cluster.sh).
std::string fake_ssh(const scratch_dir& dir) {
  auto path = dir.path / "fake-ssh";
  std::ofstream(path) << "#!/bin/sh\n"
                         "while [ \"$1\" != -- ]; do shift; done\n"
                         "exec /bin/sh -c \"$2\"\n";
  std::filesystem::permissions(path, std::filesystem::perms::owner_all);
  return path.string();
}

TEST(Launcher, ARemoteRankGetsTheTokenOnItsInputAndStopsWhenTheLauncherIsKilled) {
  scratch_dir dir;
  auto hosts = dir.path / "hosts";
  std::ofstream(hosts) << "far-away-host\n";
  setenv("TROUPE_JOB_TOKEN", "t0ken", 1);
  auto run = launch({"-n", "1", "--hosts", hosts.string(), "--ssh", fake_ssh(dir) + " -q", "--", "/bin/sh", "-c",
                     "echo $$ > " + dir.path.string() + "/pid.0; echo token=$TROUPE_JOB_TOKEN. rank=$TROUPE_RANK.; "
                     "exec sleep 60"});
  unsetenv("TROUPE_JOB_TOKEN");
  ASSERT_TRUE(run.wait_for("[0] token=t0ken. rank=0.", 10s)) << run.output();
  // SIGKILL: the launcher can stop nothing itself; the end of the remote
  // side's input must.
  run.signal(SIGKILL);
  ASSERT_TRUE(run.exited(5s));
  std::ifstream in(dir.path / "pid.0");
  pid_t pid = 0;
  ASSERT_TRUE(in >> pid);
  const bool gone = gone_within(pid, 10s);
  EXPECT_TRUE(gone) << "the remote rank (pid " << pid << ") outlived its launcher";
  if (!gone)
    kill(pid, SIGKILL);
}

TEST(Launcher, ARemoteRankThatIgnoresSigtermIsKilledAfterTheGrace) {
  scratch_dir dir;
  auto hosts = dir.path / "hosts";
  std::ofstream(hosts) << "far-away-host\nother-host\n";
  // Rank 1 fails; rank 0 ignores SIGTERM and must be killed remotely.
  auto run = launch({"-n", "2", "--grace", "0.5", "--hosts", hosts.string(), "--ssh", fake_ssh(dir), "--",
                     "/bin/sh", "-c",
                     "echo $$ > " + dir.path.string() + "/pid.$TROUPE_RANK; trap '' TERM; echo up; "
                     "if [ $TROUPE_RANK = 1 ]; then sleep 0.5; exit 3; fi; while true; do sleep 0.1; done"});
  EXPECT_EQ(exit_status(run, 10s), 3) << run.output();
  EXPECT_NE(run.output().find("rank 1 (other-host) exited with status 3"), std::string::npos) << run.output();
  // The remote grace (0.5 s, counted in 0.1 s sleeps, longer on a busy machine).
  for (int rank = 0; rank < 2; ++rank) {
    std::ifstream pid_file(dir.path / ("pid." + std::to_string(rank)));
    pid_t pid = 0;
    if (pid_file >> pid)
      gone_within(pid, 10s);
  }
  expect_all_gone(dir.path, 2);
}

TEST(Launcher, EveryRankOfAJobGetsTheSameRandomJobTokenAndEachJobADifferentOne) {
  unsetenv("TROUPE_JOB_TOKEN");
  std::vector<std::string> tokens;
  for (int job = 0; job < 2; ++job) {
    auto run = launch({"-n", "2", "--", "/bin/sh", "-c", "echo \"token=$TROUPE_JOB_TOKEN.\""});
    auto status = run.exited(20s);
    ASSERT_TRUE(status) << run.output();
    auto& out = run.output();
    std::string first;
    for (int rank = 0; rank < 2; ++rank) {
      auto at = out.find("[" + std::to_string(rank) + "] token=");
      ASSERT_NE(at, std::string::npos) << out;
      auto start = at + 10, end = out.find('.', start);
      auto token = out.substr(start, end - start);
      EXPECT_EQ(token.size(), 32u) << out; // 128 bits in hex
      EXPECT_EQ(token.find_first_not_of("0123456789abcdef"), std::string::npos) << out;
      if (rank == 0)
        first = token;
      else
        EXPECT_EQ(token, first) << out;
    }
    tokens.push_back(first);
  }
  EXPECT_NE(tokens[0], tokens[1]);
  // An exported token is the job's, passed on unchanged.
  setenv("TROUPE_JOB_TOKEN", "chosen-by-the-user", 1);
  auto run = launch({"-n", "1", "--", "/bin/sh", "-c", "echo \"token=$TROUPE_JOB_TOKEN.\""});
  ASSERT_TRUE(run.exited(20s));
  EXPECT_NE(run.output().find("[0] token=chosen-by-the-user."), std::string::npos) << run.output();
  unsetenv("TROUPE_JOB_TOKEN");
}
