#pragma once
// The thread of one of parallel/'s actors that skip CAF's mailbox
// (parameter-server shards, remote-module hosts): post() files an item from
// any thread (the router's sink runs on the data plane's) and returns at
// once; the actor's thread hands each batch to `handle`, and calls `tick`
// at least every 100 ms (deadlines), both while holding state_mutex(), so
// that readers of the actor's state from other threads take that mutex and
// never the queue's (a sink must not wait for the actor's work).
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

namespace troupe::parallel::detail {

template <class Item> class mailbox_thread {
public:
  mailbox_thread() = default;
  mailbox_thread(const mailbox_thread&) = delete;
  mailbox_thread& operator=(const mailbox_thread&) = delete;
  ~mailbox_thread() { stop(); }

  void start(std::function<void(Item&)> handle, std::function<void()> tick) {
    thread_ = std::thread([this, handle = std::move(handle), tick = std::move(tick)] {
      for (;;) {
        std::deque<Item> batch;
        {
          std::unique_lock lock(queue_mutex_);
          wake_.wait_for(lock, std::chrono::milliseconds(100), [&] { return stopping_ || !queue_.empty(); });
          if (stopping_)
            return;
          batch.swap(queue_);
        }
        std::lock_guard state(state_mutex_);
        for (auto& item : batch)
          handle(item);
        tick();
      }
    });
  }

  void post(Item item) {
    {
      std::lock_guard lock(queue_mutex_);
      queue_.push_back(std::move(item));
    }
    wake_.notify_one();
  }

  /// Held by the thread while it handles items.
  std::mutex& state_mutex() { return state_mutex_; }

  /// Drops what is queued and joins the thread (idempotent).
  void stop() {
    {
      std::lock_guard lock(queue_mutex_);
      stopping_ = true;
    }
    wake_.notify_all();
    if (thread_.joinable())
      thread_.join();
  }

private:
  std::mutex queue_mutex_;
  std::condition_variable wake_;
  std::deque<Item> queue_;
  bool stopping_ = false;
  std::mutex state_mutex_;
  std::thread thread_;
};

} // namespace troupe::parallel::detail
