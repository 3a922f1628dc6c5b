// troupe-launch: starts the ranks of a job with the rendezvous variables set,
// prefixes their output with the rank, and stops all of them when one fails,
// when the job times out, or on Ctrl-C. With --restarts N, a job whose rank
// failed is stopped and started again, up to N times; each run's ranks see
// TROUPE_RESTART=<k> (0 on the first run; job::restart()) and resume from
// their latest checkpoint themselves.
//
//   troupe-launch -n 3 -- ./build/examples/topology
//   [0] coordinator listening on 127.0.0.1:41231
//   [1] joined as worker1
//   ...
//
// Ranks on other hosts (--hosts) start over ssh (--ssh chooses the client and
// its options) and get the launcher's TROUPE_*, UCX_*, OPENBLAS_* and OMP_*
// variables; their ssh's standard input is a pipe this process holds, so a
// remote rank is stopped (SIGTERM, SIGKILL after --grace) when the launcher
// stops it, is interrupted, or dies (launcher.hpp).
//
// Exit status: 0 when every rank exited 0; otherwise the failing rank's exit
// status (128 + signal when it was killed), 124 on --timeout, 128 + signal
// when the launcher itself was interrupted, 2 for bad arguments. With
// --restarts, the status of the last run.
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "troupe/actors/launcher.hpp"
#include "troupe/actors/node_options.hpp"
#include "troupe/actors/shared_arena.hpp"

using namespace troupe::actors;
using clock_type = std::chrono::steady_clock;

namespace {

constexpr const char* usage =
  "usage: troupe-launch -n N [--hosts FILE] [--ssh CMD] [--port P] [--timeout S] [--grace S] [--restarts N]\n"
  "                     [--dry-run]\n"
  "                     -- program args...\n"
  "  -n N          number of ranks\n"
  "  --hosts FILE  lines of `host [slots=N]`; ranks on other hosts start over ssh\n"
  "  --ssh CMD     the ssh client and its options, split at spaces (default \"ssh\"),\n"
  "                e.g. --ssh \"ssh -F cluster/ssh_config\"\n"
  "  --port P      the coordinator's port (default: a free one, a new one for each restart)\n"
  "  --timeout S   stop everything after S seconds, restarts included (exit 124)\n"
  "  --grace S     time between SIGTERM and SIGKILL when stopping (default 1.5)\n"
  "  --restarts N  when a rank fails, stop the others and start the job again, at most N times\n"
  "                (default 0); the ranks see TROUPE_RESTART=<run number, from 0>\n"
  "  --dry-run     print each rank's command instead of running it\n";

int bad_arguments(const std::string& message) {
  fmt::print(stderr, "troupe-launch: {}\n{}", message, usage);
  return 2;
}

int signal_pipe[2] = {-1, -1};
volatile sig_atomic_t interrupted_by = 0;

void on_signal(int sig) {
  if (sig != SIGCHLD)
    interrupted_by = sig;
  auto saved = errno;
  char byte = 0;
  [[maybe_unused]] auto n = write(signal_pipe[1], &byte, 1);
  errno = saved;
}

// 128 random bits as hex, from the kernel's generator.
std::string random_token() {
  std::random_device device;
  std::string token;
  for (int i = 0; i < 4; ++i)
    token += fmt::format("{:08x}", device());
  return token;
}

std::uint16_t free_port() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_ANY);
  bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address);
  socklen_t length = sizeof address;
  getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length);
  close(fd);
  return ntohs(address.sin_port);
}

struct running_rank {
  rank_command command;
  pid_t pid = -1;
  int out = -1;
  int err = -1;
  int lifeline = -1; ///< a remote rank's ssh stdin: closing it stops the rank
  std::string out_partial;
  std::string err_partial;
  std::optional<int> status;
  bool stopped_by_us = false;
};

std::string describe(int status) {
  if (WIFEXITED(status))
    return fmt::format("exited with status {}", WEXITSTATUS(status));
  if (WIFSIGNALED(status))
    return fmt::format("was killed by signal {} ({})", WTERMSIG(status), strsignal(WTERMSIG(status)));
  return "ended";
}

bool failed(int status) {
  return !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

// Writes the complete lines in `partial` (all of it when `flush`) with the
// rank prefix.
void emit(std::FILE* stream, std::uint32_t rank, std::string& partial, bool flush) {
  std::size_t start = 0;
  for (;;) {
    auto newline = partial.find('\n', start);
    if (newline == std::string::npos)
      break;
    fmt::print(stream, "[{}] {}\n", rank, std::string_view(partial).substr(start, newline - start));
    start = newline + 1;
  }
  partial.erase(0, start);
  if (flush && !partial.empty()) {
    fmt::print(stream, "[{}] {}\n", rank, partial);
    partial.clear();
  }
  std::fflush(stream);
}

// Reads what is there; closes the pipe at end of file.
void pump(int& fd, std::FILE* stream, std::uint32_t rank, std::string& partial) {
  char buffer[65536];
  for (;;) {
    auto n = read(fd, buffer, sizeof buffer);
    if (n > 0) {
      partial.append(buffer, static_cast<std::size_t>(n));
      continue;
    }
    if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
      close(fd);
      fd = -1;
      emit(stream, rank, partial, true);
      return;
    }
    if (errno == EAGAIN)
      break;
  }
  emit(stream, rank, partial, false);
}

pid_t start_rank(running_rank& r) {
  int out[2];
  int err[2];
  int in[2] = {-1, -1};
  if (pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0)
    return -1;
  if (r.command.remote && pipe2(in, O_CLOEXEC) != 0)
    return -1;
  auto pid = fork();
  if (pid == 0) {
    // Its own process group, so stopping a rank also stops what it started
    // (a shell's children), and a terminal's Ctrl-C reaches only the
    // launcher, which then stops everyone in order.
    setpgid(0, 0);
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    signal(SIGCHLD, SIG_DFL);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    if (in[0] >= 0)
      dup2(in[0], 0);
    dup2(out[1], 1);
    dup2(err[1], 2);
    for (auto& var : r.command.env)
      putenv(const_cast<char*>(var.c_str()));
    std::vector<char*> argv;
    for (auto& arg : r.command.argv)
      argv.push_back(const_cast<char*>(arg.c_str()));
    argv.push_back(nullptr);
    execvp(argv[0], argv.data());
    fmt::print(stderr, "troupe-launch: cannot run {}: {}\n", r.command.argv[0], std::strerror(errno));
    _exit(127);
  }
  if (pid > 0)
    setpgid(pid, pid); // also here: no race with the first kill()
  close(out[1]);
  close(err[1]);
  if (in[0] >= 0) {
    // The token's line fits the pipe's buffer; the write end stays open (and
    // close-on-exec, so no other rank inherits it) until the rank is stopped.
    close(in[0]);
    [[maybe_unused]] auto n = write(in[1], r.command.stdin_text.data(), r.command.stdin_text.size());
    r.lifeline = in[1];
  }
  r.out = out[0];
  r.err = err[0];
  fcntl(r.out, F_SETFL, O_NONBLOCK);
  fcntl(r.err, F_SETFL, O_NONBLOCK);
  return pid;
}

void close_lifeline(running_rank& r) {
  if (r.lifeline >= 0) {
    close(r.lifeline);
    r.lifeline = -1;
  }
}

void signal_rank(running_rank& r, int sig) {
  // The end of its ssh's input is what stops a remote rank (launcher.cpp):
  // signalling ssh only ends the session, and the remote side learns of that
  // from the same end of input.
  if (!r.status)
    close_lifeline(r);
  if (r.pid > 0 && !r.status) {
    r.stopped_by_us = true;
    if (kill(-r.pid, sig) != 0)
      kill(r.pid, sig);
    // A stopped process (SIGSTOP, a hung terminal) takes SIGTERM only once
    // continued: without SIGCONT a stopped rank would hold the job for the
    // whole grace period.
    if (sig == SIGTERM && kill(-r.pid, SIGCONT) != 0)
      kill(r.pid, SIGCONT);
  }
}

/// How one run of the job ended.
struct run_outcome {
  int exit_code = 0;        ///< 0: every rank exited 0
  std::string failure;      ///< the first reason to stop; empty: none
  bool restartable = false; ///< a rank failed by itself (not Ctrl-C, --timeout or a failed start)
};

/// Starts every rank of `plan`, forwards their output, and waits until all
/// have exited; the first failure stops the others (SIGTERM, SIGKILL after
/// `grace`). `deadline`: --timeout's end, for every run together.
run_outcome run_job(const std::vector<rank_command>& plan, std::chrono::milliseconds grace,
                    std::optional<clock_type::time_point> deadline, std::optional<double> timeout_s) {
  std::vector<running_rank> ranks;
  for (auto& command : plan) {
    running_rank r;
    r.command = command;
    ranks.push_back(std::move(r));
  }
  run_outcome outcome;
  auto kill_at = clock_type::time_point::max(); // SIGKILL for what is left then; max: not stopping
  std::optional<clock_type::time_point> drain_until;
  auto stop_all = [&](std::string reason, int code, bool restartable) {
    if (!outcome.failure.empty())
      return;
    outcome = {code, std::move(reason), restartable};
    fmt::print(stderr, "troupe-launch: {}; stopping all ranks\n", outcome.failure);
    for (auto& r : ranks)
      signal_rank(r, SIGTERM);
    kill_at = clock_type::now() + grace;
  };
  for (auto& r : ranks) {
    r.pid = start_rank(r);
    if (r.pid < 0) {
      stop_all(fmt::format("cannot start rank {}: {}", r.command.rank, std::strerror(errno)), 1, false);
      break;
    }
  }

  for (;;) {
    std::vector<pollfd> fds{{signal_pipe[0], POLLIN, 0}};
    for (auto& r : ranks) {
      if (r.out >= 0)
        fds.push_back({r.out, POLLIN, 0});
      if (r.err >= 0)
        fds.push_back({r.err, POLLIN, 0});
    }
    poll(fds.data(), fds.size(), 50);
    char drain[64];
    while (read(signal_pipe[0], drain, sizeof drain) > 0) {
    }
    for (auto& r : ranks) {
      if (r.out >= 0)
        pump(r.out, stdout, r.command.rank, r.out_partial);
      if (r.err >= 0)
        pump(r.err, stderr, r.command.rank, r.err_partial);
    }
    for (auto& r : ranks) {
      int status = 0;
      if (r.pid > 0 && !r.status && waitpid(r.pid, &status, WNOHANG) == r.pid) {
        r.status = status;
        close_lifeline(r);
        // A rank that was killed could not unlink its shared arena.
        troupe::actors::shared_arena::remove_left_by(r.pid);
        if (failed(status) && !r.stopped_by_us)
          stop_all(fmt::format("rank {} ({}) {}", r.command.rank, r.command.node_name, describe(status)),
                   WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status), true);
      }
    }
    if (interrupted_by != 0)
      stop_all(fmt::format("interrupted by {}", strsignal(interrupted_by)), 128 + interrupted_by, false);
    if (deadline && clock_type::now() >= *deadline)
      stop_all(fmt::format("the job ran longer than --timeout={} s", *timeout_s), 124, false);
    if (clock_type::now() >= kill_at) {
      for (auto& r : ranks)
        signal_rank(r, SIGKILL);
      kill_at = clock_type::time_point::max();
    }
    bool all_exited = std::all_of(ranks.begin(), ranks.end(), [](auto& r) { return r.pid < 0 || r.status; });
    if (all_exited) {
      // What a rank left running (a backgrounded grandchild) may hold its
      // pipes open: read for a moment, then stop waiting.
      if (!drain_until)
        drain_until = clock_type::now() + std::chrono::milliseconds(500);
      bool open = std::any_of(ranks.begin(), ranks.end(), [](auto& r) { return r.out >= 0 || r.err >= 0; });
      if (!open || clock_type::now() >= *drain_until)
        break;
    }
  }
  for (auto& r : ranks) {
    close_lifeline(r);
    if (r.out >= 0) {
      emit(stdout, r.command.rank, r.out_partial, true);
      close(r.out);
    }
    if (r.err >= 0) {
      emit(stderr, r.command.rank, r.err_partial, true);
      close(r.err);
    }
  }
  if (!outcome.failure.empty()) {
    for (auto& r : ranks)
      if (r.status && r.stopped_by_us)
        fmt::print(stderr, "troupe-launch: rank {} ({}) stopped: {}\n", r.command.rank, r.command.node_name,
                   describe(*r.status));
    if (outcome.exit_code == 0)
      outcome.exit_code = 1;
  }
  return outcome;
}

} // namespace

int main(int argc, char** argv) {
  launch_request request;
  std::optional<double> timeout_s;
  // The job must end within 2 s of a rank's failure: ranks die at once on
  // SIGTERM unless they handle it, and one that does gets this long.
  double grace_s = 1.5;
  std::uint32_t restarts = 0;
  bool dry_run = false;
  std::string hosts_file;
  bool have_n = false;
  int i = 1;
  auto number = [&](std::string_view value) -> std::optional<double> {
    char* end = nullptr;
    std::string text(value);
    double parsed = std::strtod(text.c_str(), &end);
    if (text.empty() || *end != '\0' || !(parsed > 0))
      return std::nullopt;
    return parsed;
  };
  for (; i < argc; ++i) {
    std::string_view arg = argv[i];
    if (arg == "--") {
      ++i;
      break;
    }
    auto value_of = [&](std::string_view flag) -> std::optional<std::string> {
      if (arg.starts_with(std::string(flag) + "="))
        return std::string(arg.substr(flag.size() + 1));
      if (arg == flag && i + 1 < argc)
        return std::string(argv[++i]);
      return std::nullopt;
    };
    auto flag_of = [&]() { return std::string(arg.substr(0, arg.find('='))); };
    if (arg == "-h" || arg == "--help") {
      fmt::print("{}", usage);
      return 0;
    }
    if (arg == "--dry-run") {
      dry_run = true;
    } else if (arg == "-n" || arg.starts_with("-n=")) {
      auto value = value_of("-n");
      if (!value)
        return bad_arguments("-n needs a value");
      auto n = parse_count(*value, "-n");
      if (!n || *n == 0)
        return bad_arguments(fmt::format("-n=\"{}\" is not a positive integer", *value));
      request.ranks = *n;
      have_n = true;
    } else if (arg == "--restarts" || arg.starts_with("--restarts=")) {
      auto value = value_of("--restarts");
      if (!value)
        return bad_arguments("--restarts needs a value");
      auto n = parse_count(*value, "--restarts");
      if (!n)
        return bad_arguments(fmt::format("--restarts=\"{}\" is not a non-negative integer", *value));
      restarts = *n;
    } else if (arg == "--hosts" || arg.starts_with("--hosts=")) {
      auto value = value_of("--hosts");
      if (!value)
        return bad_arguments("--hosts needs a file");
      hosts_file = *value;
    } else if (arg == "--ssh" || arg.starts_with("--ssh=")) {
      auto value = value_of("--ssh");
      std::istringstream words(value.value_or(""));
      request.ssh.clear();
      for (std::string word; words >> word;)
        request.ssh.push_back(word);
      if (request.ssh.empty())
        return bad_arguments("--ssh needs a command, e.g. --ssh \"ssh -F FILE\"");
    } else if (arg == "--port" || arg.starts_with("--port=")) {
      auto value = value_of("--port");
      auto port = value ? parse_count(*value, "--port") : troupe::expected<std::uint32_t>(troupe::make_error(troupe::errc::invalid_argument, "--port needs a value"));
      if (!port || *port > 65535)
        return bad_arguments(port ? fmt::format("--port=\"{}\" is not in [0, 65535]", *value) : port.error().message());
      request.port = static_cast<std::uint16_t>(*port);
    } else if (arg == "--timeout" || arg.starts_with("--timeout=") || arg == "--grace" || arg.starts_with("--grace=")) {
      auto flag = flag_of();
      auto value = value_of(flag);
      auto seconds = value ? number(*value) : std::nullopt;
      if (!seconds)
        return bad_arguments(fmt::format("{}=\"{}\" is not a positive number of seconds", flag, value.value_or("")));
      if (flag == "--timeout")
        timeout_s = *seconds;
      else
        grace_s = *seconds;
    } else {
      return bad_arguments(fmt::format("unknown argument \"{}\" (the program goes after --)", arg));
    }
  }
  for (; i < argc; ++i)
    request.program.push_back(argv[i]);
  if (!have_n)
    return bad_arguments("-n N is required");
  if (!hosts_file.empty()) {
    std::ifstream in(hosts_file);
    if (!in)
      return bad_arguments(fmt::format("hosts file \"{}\" cannot be read", hosts_file));
    std::stringstream text;
    text << in.rdbuf();
    auto hosts = parse_hosts(text.str(), hosts_file);
    if (!hosts)
      return bad_arguments(hosts.error().message());
    request.hosts = *hosts;
  }
  const bool chosen_port = request.port != 0;
  if (!chosen_port)
    request.port = free_port();
  char cwd[4096];
  if (getcwd(cwd, sizeof cwd))
    request.working_directory = cwd;
  // One secret per job, so that only this job's ranks pass each other's
  // control-plane guard; an exported TROUPE_JOB_TOKEN is passed on instead.
  if (const char* given = std::getenv("TROUPE_JOB_TOKEN"); given && *given)
    request.job_token = given;
  else
    request.job_token = dry_run ? "<random per job>" : random_token();
  request.forwarded_env = forwarded_variables(current_environment());
  request.remote_grace_s = grace_s;
  auto plan = plan_launch(request);
  if (!plan)
    return bad_arguments(plan.error().message());
  if (dry_run) {
    for (auto& command : *plan) {
      if (command.remote)
        fmt::print("rank {} on {}: {} (the job token on its standard input)\n", command.rank, command.host,
                   shell_line(command.argv));
      else
        fmt::print("rank {} on {}: env {} {}\n", command.rank, command.host, shell_line(command.env),
                   shell_line(command.argv));
    }
    return 0;
  }

  // Signals arrive through a pipe so the loop below handles them in order.
  if (pipe2(signal_pipe, O_CLOEXEC | O_NONBLOCK) != 0)
    return 1;
  struct sigaction action {};
  action.sa_handler = on_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  sigaction(SIGINT, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);
  sigaction(SIGHUP, &action, nullptr);
  sigaction(SIGCHLD, &action, nullptr);
  signal(SIGPIPE, SIG_IGN);

  const auto grace = std::chrono::milliseconds(static_cast<std::int64_t>(grace_s * 1000));
  std::optional<clock_type::time_point> deadline;
  if (timeout_s)
    deadline = clock_type::now() + std::chrono::milliseconds(static_cast<std::int64_t>(*timeout_s * 1000));
  for (std::uint32_t restart = 0;; ++restart) { // `restart` runs restarted so far
    auto outcome = run_job(*plan, grace, deadline, timeout_s);
    if (outcome.failure.empty())
      return 0;
    if (!outcome.restartable || restart == restarts || interrupted_by != 0) {
      fmt::print(stderr, "troupe-launch: failed: {}\n", outcome.failure);
      return outcome.exit_code;
    }
    fmt::print(stderr, "troupe-launch: restarting the job (restart {} of {}) after: {}\n", restart + 1, restarts,
               outcome.failure);
    request.restart = restart + 1;
    // A fresh coordinator port: the last run's may still be held (TIME_WAIT,
    // or a rank on another host that has not exited yet).
    const auto old_port = request.port;
    for (int tries = 0; !chosen_port && request.port == old_port && tries < 8; ++tries)
      request.port = free_port();
    plan = plan_launch(request);
    if (!plan) { // cannot happen: the first plan from the same request succeeded
      fmt::print(stderr, "troupe-launch: {}\n", plan.error().message());
      return 1;
    }
  }
}
