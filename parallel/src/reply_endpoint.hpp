#pragma once
// A caller's end of request/reply exchanges with parallel/'s actors
// (parameter-server shards, remote-module hosts): a place whose router sink
// files each reply under its request id, bounded waits for them, and a
// sticky failure (a lost peer, a shutdown) that ends every wait at once.
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <caf/actor.hpp>

#include "troupe/actors/node.hpp"
#include "troupe/actors/peer_monitor.hpp"
#include "troupe/actors/tensor_message.hpp"
#include "troupe/actors/trace.hpp"
#include "troupe/tensor/expected.hpp"
#include "troupe/tensor/tensor.hpp"

namespace troupe::parallel::detail {

class reply_endpoint : public std::enable_shared_from_this<reply_endpoint> {
public:
  /// Registers `place` on `node`; replies are messages whose context id is
  /// the request's, an error reply is message_kind::control with its text.
  static expected<std::shared_ptr<reply_endpoint>> open(actors::node& node, std::string place);
  ~reply_endpoint();
  reply_endpoint(const reply_endpoint&) = delete;
  reply_endpoint& operator=(const reply_endpoint&) = delete;

  /// When a node is lost, `why` says whether that ends this endpoint (the
  /// failure's text) or not (nullopt).
  void fail_when_lost(std::function<std::optional<std::string>(const actors::peer_lost&)> why);
  /// Ends every wait, now and later, with `why` (the first failure stays).
  void fail(std::string why);
  std::optional<std::string> failure() const;

  /// Announces a request before it is sent; the failure's text if failed.
  expected<void> expect(std::uint64_t request);
  /// Forgets requests whose sends failed.
  void forget(const std::vector<std::uint64_t>& requests);
  /// The replies to `requests`, in order, waiting at most `timeout`: the
  /// first error reply's text, the failure's, or "no reply to <what>
  /// within N ms" otherwise. Forgets the requests either way.
  expected<std::vector<tensor>> wait(const std::vector<std::uint64_t>& requests, std::chrono::milliseconds timeout,
                                     const std::string& what);

  /// Unregisters the place and fails what still waits (idempotent).
  void close(std::string why);
  /// The place's name in the trace: the sender to give the requests' sends.
  trace::name_id trace_name() const noexcept { return trace_name_; }

private:
  reply_endpoint(actors::node& node, std::string place)
      : node_(node), place_(std::move(place)), trace_name_(trace::intern(place_)) {}
  void on_reply(const actors::tensor_message& m);

  struct reply {
    tensor value;
    std::optional<std::string> error;
    bool done = false;
  };
  actors::node& node_;
  std::string place_;
  trace::name_id trace_name_;
  caf::actor handle_;
  std::uint64_t peer_lost_handler_ = 0;
  mutable std::mutex mutex_;
  std::condition_variable arrived_;
  std::map<std::uint64_t, reply> replies_;
  std::optional<std::string> failure_;
  bool closed_ = false;
};

} // namespace troupe::parallel::detail
