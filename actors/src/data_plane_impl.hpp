#pragma once
// data_plane::impl: the data plane's state and the transport thread that
// owns it (thread model: data_plane.hpp), declared here for the three files
// that define its parts:
//   data_plane.cpp          start-up, the transport thread's loop, peers
//                           (connect, drop), shutdown, data_plane's own
//                           members, and the flow control step by step;
//   data_plane_send.cpp     the send path: queueing, posting to UCX and
//                           completing sends (flow control steps 1, 2, 5);
//   data_plane_receive.cpp  what arrives: the AM handlers, delivery and
//                           acks (steps 3, 4).
// The parts without UCX have units of their own: the frames
// (data_plane_wire), a peer's queue and credits (data_plane_send_queue),
// ack coalescing (data_plane_acks) and receive buffers
// (data_plane_receive_pool). Private to actors/src.
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include <unistd.h>

#include <fmt/format.h>
#include <ucp/api/ucp.h>

#include "data_plane_acks.hpp"
#include "data_plane_receive_pool.hpp"
#include "data_plane_send_queue.hpp"
#include "data_plane_wire.hpp"
#include "troupe/actors/data_plane.hpp"
#include "troupe/actors/trace.hpp"
#include "troupe/serialization/decode.hpp"
#include "ucx_handshake_deadline.hpp"

namespace troupe::actors {

class data_plane::impl : public std::enable_shared_from_this<data_plane::impl> {
public:
  using clock_type = std::chrono::steady_clock;
  using send_op = detail::send_op;

  /// One remote node. `closed` and the queue and rendezvous slots of
  /// `sends` are guarded by mutex_; the rest belong to the transport thread
  /// (credits, endpoints, acks owed).
  struct peer {
    peer_id id = 0;
    std::string name;
    trace::name_id trace_name; // the peer's node name, interned once
    detail::send_queue sends;
    bool closed = false; // mutex_
    bool on_another_host = false; // mutex_; set by connect()
    // transport thread
    ucp_ep_h own_ep = nullptr;   // created by connect(); we close it
    ucp_ep_h reply_ep = nullptr; // the peer's endpoint towards us (from its hello)
    std::uint64_t remote_id = 0; // the peer's id for us, echoed in acks
    detail::owed_ack ack;        // sent by flush_acks()
    explicit peer(const data_plane_options& options) : sends(options) {}
    ucp_ep_h ep() const { return own_ep ? own_ep : reply_ep; }
  };

  /// A small control AM (hello, ack, goodbye) whose header must outlive the
  /// send: UCX reads the header until completion.
  struct control_op {
    std::vector<std::byte> header;
  };

  /// A rendezvous receive in progress.
  struct receive_op {
    impl* owner = nullptr;
    peer_id from = 0;
    std::vector<std::uint64_t> header; // copy: UCX's header dies with the handler
    std::size_t header_bytes = 0;
    std::shared_ptr<storage> buffer;
    std::size_t credit_bytes = 0;
    std::int64_t start_ns = 0; // trace: when the frame arrived
  };

  explicit impl(data_plane_options options);
  ~impl();
  expected<void> init();

  // -- calls from any thread --------------------------------------------------

  expected<peer_id> connect(std::string name, std::span<const std::byte> address, bool on_another_host);
  expected<void> send(peer_id to, tensor_message message, completion_callback done);
  expected<void> send_by_reference(peer_id to, tensor_message message, const arena_ref& region,
                                   completion_callback done);
  void send_release(peer_id to, const arena_ref& region);
  void disconnect(peer_id who);
  expected<peer_id> find_peer(const std::string& name) const;
  std::string peer_name(peer_id who) const;
  data_plane_stats stats() const;
  std::size_t in_flight(peer_id who, bool high) const;
  bool is_receive_buffer(const void* ptr) const { return receive_buffers_.contains(ptr); }
  const std::vector<std::byte>& address() const { return address_; }
  void close();

private:
  // -- helpers for other threads (data_plane.cpp) -----------------------------

  expected<void> post(std::function<void()> command);

  void wake() {
    std::uint64_t one = 1;
    [[maybe_unused]] auto n = ::write(wake_fd_, &one, sizeof one);
  }

  peer* find(peer_id who) {
    if (who == 0 || who > peers_.size())
      return nullptr;
    return peers_[who - 1].get();
  }
  peer* find_locked(peer_id who) {
    std::lock_guard guard(mutex_);
    return find(who);
  }

  // -- transport thread (data_plane.cpp) --------------------------------------

  void run();
  void sweep_silent_connections(clock_type::time_point now);
  bool transfers_under_way() const {
    return rendezvous_sends_pending_ > 0 || rendezvous_receives_pending_ > 0;
  }
  bool work_waiting();
  bool drain();
  expected<peer_id> do_connect(std::string name, const std::vector<std::byte>& address, bool on_another_host);
  peer* add_peer(std::string name); // requires mutex_
  void send_control(ucp_ep_h ep, unsigned id, std::vector<std::byte> header);
  void drop_peer(peer& p, std::string_view why, bool force_close);
  void shutdown();

  // -- the send path (data_plane_send.cpp) ------------------------------------

  expected<void> enqueue(std::unique_ptr<send_op> op);
  void send_releases();
  void pump_all();
  void post_send(std::unique_ptr<send_op> op);
  static void on_send_done(void* request, ucs_status_t status, void* user_data);
  void complete_send(std::unique_ptr<send_op> op, ucs_status_t status);

  // -- what arrives (data_plane_receive.cpp) ---------------------------------
  // AM handlers run on the transport thread, inside ucp_worker_progress.

  /// A UCX active-message handler (ucp_am_recv_callback_t); `arg` is this.
  using am_handler = ucs_status_t(void* arg, const void* header, std::size_t header_length,
                                  void* data, std::size_t length,
                                  const ucp_am_recv_param_t* param);
  static am_handler on_hello_am;
  static am_handler on_ack_am;
  static am_handler on_arena_am;
  static am_handler on_release_am;
  static am_handler on_goodbye_am;
  static am_handler on_data_am;
  peer* sender_of(const ucp_am_recv_param_t* param);
  std::string describe(const ucp_am_recv_param_t* param);
  ucs_status_t receive(const void* header, std::size_t header_length, void* data,
                       std::size_t length, const ucp_am_recv_param_t* param);
  static void on_receive_done(void* request, ucs_status_t status, std::size_t length,
                              void* user_data);
  void deliver(std::unique_ptr<receive_op> op, bool zero_copy);
  void send_ack(peer* p, std::size_t bytes);
  void flush_acks();
  void flush_ack(peer& p);
  void drop(const ucp_am_recv_param_t* param, detail::drop_counter counter, std::string reason);
  std::shared_ptr<storage> lend_buffer(std::size_t bytes);
  void release_data(void* data);

  static std::string status_text(ucs_status_t status) { return ucs_status_string(status); }

  template <class... Ts> void log(fmt::format_string<Ts...> format, Ts&&... args) {
    fmt::print(stderr, "troupe data plane [{}]: {}\n", options_.node_name,
               fmt::format(format, std::forward<Ts>(args)...));
  }

  data_plane_options options_;
  trace::name_id trace_self_; // "<node>/ucx": the track of this data plane's transfers
  decode_options decode_options_;
  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  std::vector<std::byte> address_;
  int wake_fd_ = -1;
  int epoll_fd_ = -1;
  static constexpr int idle_progress_ms = 200;
  static constexpr std::chrono::seconds sweep_interval{1};
  std::optional<detail::ucx_handshake_deadline> handshake_deadline_; // transport thread after init
  std::thread thread_;

  mutable std::mutex mutex_; // peers_ (the list and each queue), commands_, stats_
  std::vector<std::unique_ptr<peer>> peers_;
  std::vector<std::function<void()>> commands_;
  std::vector<std::pair<peer_id, std::vector<std::byte>>> releases_out_; // release headers to send
  data_plane_stats stats_;
  bool sends_waiting_ = false;
  bool closing_ = false;
  bool running_ = false;

  // transport thread only
  detail::ack_coalescer<peer> acks_;
  std::unordered_map<ucp_ep_h, peer_id> by_reply_ep_;
  bool closing_now_ = false;
  // Rendezvous sends posted and receives pulling, not yet complete in UCX
  // (written by the transport thread only; atomic for stats()).
  std::atomic<std::uint64_t> rendezvous_sends_pending_{0};
  std::atomic<std::uint64_t> rendezvous_receives_pending_{0};

  detail::receive_buffer_pool receive_buffers_;

  std::mutex release_mutex_;
  std::vector<void*> releases_;
  bool thread_running_ = true;
};

} // namespace troupe::actors
