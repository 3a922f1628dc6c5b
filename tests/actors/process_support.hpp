#pragma once
// Child processes for multi-process tests: started from a path (usually the
// test binary itself, re-executed in a child mode), output captured through a
// pipe, every wait bounded, and the process killed by its pid when the
// handle goes out of scope.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <netinet/in.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "troupe/actors/shared_arena.hpp"

namespace troupe::test {

using namespace std::chrono_literals;

class child_process {
public:
  child_process() = default;
  child_process(const child_process&) = delete;
  child_process& operator=(const child_process&) = delete;
  child_process(child_process&& other) noexcept { *this = std::move(other); }
  child_process& operator=(child_process&& other) noexcept {
    std::swap(pid_, other.pid_);
    std::swap(out_, other.out_);
    std::swap(in_, other.in_);
    std::swap(output_, other.output_);
    std::swap(status_, other.status_);
    return *this;
  }
  ~child_process() { kill_and_reap(); }

  /// Starts `path` with `args` (argv[1..]) and `env` added to this
  /// process's environment; stdout and stderr go to one pipe.
  static child_process start(const std::string& path, const std::vector<std::string>& args,
                             const std::vector<std::string>& env = {}) {
    int out[2];
    int in[2];
    if (pipe2(out, O_CLOEXEC) != 0 || pipe2(in, O_CLOEXEC) != 0)
      return {};
    child_process child;
    child.pid_ = fork();
    if (child.pid_ == 0) {
      dup2(out[1], 1);
      dup2(out[1], 2);
      dup2(in[0], 0);
      for (auto& var : env)
        putenv(const_cast<char*>(var.c_str()));
      std::vector<char*> argv{const_cast<char*>(path.c_str())};
      for (auto& arg : args)
        argv.push_back(const_cast<char*>(arg.c_str()));
      argv.push_back(nullptr);
      execv(path.c_str(), argv.data());
      _exit(127);
    }
    close(out[1]);
    close(in[0]);
    child.out_ = out[0];
    child.in_ = in[1];
    fcntl(child.out_, F_SETFL, O_NONBLOCK);
    return child;
  }

  /// The test binary itself.
  static std::string self_path() {
    char buffer[4096];
    auto n = readlink("/proc/self/exe", buffer, sizeof buffer - 1);
    return std::string(buffer, n > 0 ? static_cast<std::size_t>(n) : 0);
  }

  pid_t pid() const { return pid_; }
  const std::string& output() { drain(0ms); return output_; }

  /// Waits until the output contains `needle`; false after `timeout`.
  bool wait_for(std::string_view needle, std::chrono::milliseconds timeout) {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      if (output_.find(needle) != std::string::npos)
        return true;
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (left <= 0ms)
        return false;
      if (!drain(std::min(left, std::chrono::milliseconds(50))) && exited(0ms))
        return output_.find(needle) != std::string::npos;
    }
  }

  /// Closes the child's stdin (children in this suite stop cleanly on EOF).
  void close_stdin() {
    if (in_ >= 0)
      close(in_);
    in_ = -1;
  }

  void signal(int sig) {
    if (pid_ > 0 && !status_)
      ::kill(pid_, sig);
  }

  /// The wait status once the child exited, within `timeout`.
  std::optional<int> exited(std::chrono::milliseconds timeout) {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    while (pid_ > 0 && !status_) {
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        status_ = status;
        reaped();
        break;
      }
      if (std::chrono::steady_clock::now() >= deadline)
        break;
      drain(10ms);
    }
    return status_;
  }

  void kill_and_reap() {
    if (pid_ > 0 && !status_) {
      ::kill(pid_, SIGCONT);
      ::kill(pid_, SIGKILL);
      int status = 0;
      waitpid(pid_, &status, 0);
      status_ = status;
      reaped();
    }
    if (out_ >= 0)
      close(out_);
    out_ = -1;
    close_stdin();
  }

private:
  // A child killed by a test cannot unlink its node's shared arena.
  void reaped() { actors::shared_arena::remove_left_by(pid_); }

  // Reads what is available, waiting up to `timeout` for something.
  bool drain(std::chrono::milliseconds timeout) {
    if (out_ < 0)
      return false;
    pollfd fd{out_, POLLIN, 0};
    if (poll(&fd, 1, static_cast<int>(timeout.count())) <= 0)
      return false;
    char buffer[4096];
    bool got = false;
    for (;;) {
      auto n = read(out_, buffer, sizeof buffer);
      if (n <= 0)
        break;
      output_.append(buffer, static_cast<std::size_t>(n));
      got = true;
    }
    return got;
  }

  pid_t pid_ = -1;
  int out_ = -1;
  int in_ = -1;
  std::string output_;
  std::optional<int> status_;
};

/// Node flags for rank `rank` of a 2-process job on loopback, named `name`,
/// whose coordinator (rank 0) listens on `port`.
inline std::vector<std::string> rank_flags(std::uint32_t rank, const std::string& name, std::uint16_t port) {
  return {"--troupe.name=" + name, "--troupe.rank=" + std::to_string(rank), "--troupe.world-size=2",
          "--troupe.join-timeout=20s", "--troupe.listen-address=127.0.0.1",
          "--troupe.coordinator=127.0.0.1:" + std::to_string(port)};
}

/// A TCP port on 127.0.0.1 that nobody listened on a moment ago.
inline std::uint16_t unused_port() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address);
  socklen_t length = sizeof address;
  getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length);
  close(fd);
  return ntohs(address.sin_port);
}

inline double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

} // namespace troupe::test
