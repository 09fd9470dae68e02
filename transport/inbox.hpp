#pragma once
// A blocking queue from the loop thread to a thread that waits (code without
// actors: the `troupe submit` client, tests). push() never blocks; pop()
// waits at most `timeout`.
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <optional>

namespace troupe::transport {

template <class T>
class Inbox {
 public:
  void push(T item) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      items_.push_back(std::move(item));
    }
    ready_.notify_one();
  }

  // The oldest item, or nullopt when none came within `timeout`.
  std::optional<T> pop(std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mutex_);
    if (!ready_.wait_for(lock, timeout, [&] { return !items_.empty(); })) return std::nullopt;
    T item = std::move(items_.front());
    items_.pop_front();
    return item;
  }

  size_t size() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return items_.size();
  }

 private:
  mutable std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<T> items_;
};

}  // namespace troupe::transport
