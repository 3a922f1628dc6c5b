#pragma once
// A peer benchmark running as a child process that answers one line per
// command on its stdin (see peers/*.py), so a C++ benchmark can interleave
// rounds of its own work with rounds of the peer's in the same run.
#include <csignal>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include <fcntl.h>
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

namespace troupe::bench {

class peer_process {
public:
  /// Starts `argv[0]` with `argv`; nullopt-like state (ok() false) when it
  /// cannot be started (for example python3-torch is not installed).
  /// `argv[0]` is looked up on PATH. SIGPIPE is ignored from here on: a peer
  /// that died is seen as a failed write or an EOF, not by killing the
  /// benchmark (which would also lose its buffered report).
  explicit peer_process(const std::vector<std::string>& argv) {
    std::signal(SIGPIPE, SIG_IGN);
    int to_child[2];
    int from_child[2];
    if (pipe(to_child) != 0)
      return;
    if (pipe(from_child) != 0) {
      close(to_child[0]);
      close(to_child[1]);
      return;
    }
    pid_ = fork();
    if (pid_ == 0) {
      dup2(to_child[0], 0);
      dup2(from_child[1], 1);
      close(to_child[1]);
      close(from_child[0]);
      std::vector<char*> args;
      for (const auto& a : argv)
        args.push_back(const_cast<char*>(a.c_str()));
      args.push_back(nullptr);
      execvp(args[0], args.data());
      std::fprintf(stderr, "peer_process: cannot start '%s'\n", args[0]);
      _exit(127);
    }
    close(to_child[0]);
    close(from_child[1]);
    in_ = to_child[1];
    out_ = from_child[0];
  }

  peer_process(const peer_process&) = delete;
  peer_process& operator=(const peer_process&) = delete;

  ~peer_process() {
    if (in_ >= 0) {
      [[maybe_unused]] auto n = write(in_, "quit\n", 5);
      close(in_);
    }
    if (out_ >= 0)
      close(out_);
    if (pid_ > 0) {
      // Bounded wait, then stop it by its id.
      for (int i = 0; i < 50; ++i) {
        if (waitpid(pid_, nullptr, WNOHANG) == pid_)
          return;
        usleep(100'000);
      }
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }

  bool started() const noexcept { return pid_ > 0 && in_ >= 0; }
  pid_t pid() const noexcept { return pid_; }

  /// Sends one command line without reading anything: its answer stays for
  /// read_line. (ask(command, 0) would take an answer that came at once and
  /// drop it, as a broadcast's root, which waits for nobody, can give.)
  bool tell(const std::string& command) {
    auto line = command + "\n";
    return write(in_, line.data(), line.size()) == static_cast<ssize_t>(line.size());
  }

  /// Sends one command line and returns the next output line, or nullopt on
  /// EOF or when nothing arrives within `timeout_ms`.
  std::optional<std::string> ask(const std::string& command, int timeout_ms) {
    if (!command.empty() && !tell(command))
      return std::nullopt;
    return read_line(timeout_ms);
  }

  std::optional<std::string> read_line(int timeout_ms) {
    while (true) {
      auto pos = buffer_.find('\n');
      if (pos != std::string::npos) {
        auto line = buffer_.substr(0, pos);
        buffer_.erase(0, pos + 1);
        return line;
      }
      pollfd pfd{out_, POLLIN, 0};
      if (poll(&pfd, 1, timeout_ms) <= 0)
        return std::nullopt;
      char chunk[4096];
      auto n = read(out_, chunk, sizeof chunk);
      if (n <= 0)
        return std::nullopt;
      buffer_.append(chunk, static_cast<std::size_t>(n));
    }
  }

private:
  pid_t pid_ = -1;
  int in_ = -1;
  int out_ = -1;
  std::string buffer_;
};

/// Numbers of a JSON array field `"key": [a, b, ...]` in a one-line JSON
/// object written by our own peer scripts (not a general JSON parser).
inline std::vector<double> json_numbers(const std::string& line, const std::string& key) {
  std::vector<double> out;
  auto at = line.find("\"" + key + "\"");
  if (at == std::string::npos)
    return out;
  auto open = line.find('[', at);
  auto close_at = line.find(']', open);
  if (open == std::string::npos || close_at == std::string::npos)
    return out;
  auto body = line.substr(open + 1, close_at - open - 1);
  std::size_t pos = 0;
  while (pos < body.size()) {
    std::size_t used = 0;
    try {
      out.push_back(std::stod(body.substr(pos), &used));
    } catch (...) {
      break;
    }
    pos += used;
    while (pos < body.size() && (body[pos] == ',' || body[pos] == ' '))
      ++pos;
  }
  return out;
}

/// A number field `"key": x` of such a line, or nullopt.
inline std::optional<double> json_number(const std::string& line, const std::string& key) {
  auto at = line.find("\"" + key + "\"");
  if (at == std::string::npos)
    return std::nullopt;
  auto colon = line.find(':', at);
  if (colon == std::string::npos)
    return std::nullopt;
  try {
    return std::stod(line.substr(colon + 1));
  } catch (...) {
    return std::nullopt;
  }
}

/// A string field `"key": "text"` of such a line (no escapes inside), or
/// nullopt.
inline std::optional<std::string> json_string(const std::string& line, const std::string& key) {
  auto at = line.find("\"" + key + "\"");
  if (at == std::string::npos)
    return std::nullopt;
  auto open = line.find('"', line.find(':', at));
  if (open == std::string::npos)
    return std::nullopt;
  auto close_at = line.find('"', open + 1);
  if (close_at == std::string::npos)
    return std::nullopt;
  return line.substr(open + 1, close_at - open - 1);
}

} // namespace troupe::bench
