#include "model/kv_prefault.hpp"

#include <pthread.h>
#include <sched.h>
#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>
#include <stdexcept>
#include <string>

namespace troupe::model {

KvPrefault kv_prefault_from(const char* value) {
  const std::string s = value ? value : "1";
  if (s == "1") return KvPrefault::kAhead;
  if (s == "0") return KvPrefault::kOff;
  if (s == "all") return KvPrefault::kWhole;
  throw std::invalid_argument(
      "TROUPE_KV_PREFAULT must be 0 (pages fault in at their first write), 1 (mapped ahead of the "
      "blocks in use) or all (every pool mapped when the worker starts), got '" +
      s + "'");
}

KvPrefault kv_prefault_mode() {
  static const KvPrefault mode = kv_prefault_from(std::getenv("TROUPE_KV_PREFAULT"));
  return mode;
}

KvPrefaultPolicy::KvPrefaultPolicy(int64_t pool_bytes, int64_t block_bytes, int64_t ahead_bytes,
                                   int64_t page_bytes)
    : pool_bytes_(pool_bytes), block_bytes_(block_bytes), ahead_bytes_(ahead_bytes), page_bytes_(page_bytes) {
  if (pool_bytes < 0 || block_bytes < 1 || ahead_bytes < 0 || page_bytes < 1)
    throw std::invalid_argument(
        "KvPrefaultPolicy: want pool_bytes >= 0, block_bytes >= 1, ahead_bytes >= 0, "
        "page_bytes >= 1");
}

int64_t KvPrefaultPolicy::on_write(int64_t highest) {
  const int64_t end = (std::max<int64_t>(highest, -1) + 1) * block_bytes_ + ahead_bytes_;
  const int64_t want = std::min(pool_bytes_, (end + page_bytes_ - 1) / page_bytes_ * page_bytes_);
  if (want <= asked_) return 0;
  asked_ = want;
  return want;
}

PagePrefaulter::PagePrefaulter(std::vector<std::pair<char*, size_t>> ranges, size_t piece_bytes)
    : ranges_(std::move(ranges)), piece_bytes_(std::max<size_t>(piece_bytes, 1)) {
  for (const auto& r : ranges_) limit_ = std::max(limit_, r.second);
}

PagePrefaulter::~PagePrefaulter() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void PagePrefaulter::request(size_t bytes) {
  bytes = std::min(bytes, limit_);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (bytes <= target_ || failed_) return;
    target_ = bytes;
    if (!thread_.joinable()) {
      thread_ = std::thread([this] { loop(); });
      pthread_setname_np(thread_.native_handle(), "kv-prefault");
    }
  }
  wake_.notify_one();
}

void PagePrefaulter::wait() {
  std::unique_lock<std::mutex> lock(mu_);
  settled_.wait(lock, [&] { return failed_ || done_ >= target_; });
}

bool PagePrefaulter::failed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return failed_;
}

size_t PagePrefaulter::done() const {
  std::lock_guard<std::mutex> lock(mu_);
  return done_;
}

void PagePrefaulter::loop() {
  // Only on a CPU nothing else wants: the pages are for later steps, and a
  // CPU taken from the step now would cost what the thread is there to save.
  sched_param idle{};
  pthread_setschedparam(pthread_self(), SCHED_IDLE, &idle);
  for (;;) {
    size_t from = 0, to = 0;
    {
      std::unique_lock<std::mutex> lock(mu_);
      wake_.wait(lock, [&] { return stop_ || done_ < target_; });
      if (stop_) return;
      from = done_;
      to = std::min(target_, from + piece_bytes_);
    }
    bool ok = true;
#ifdef MADV_POPULATE_WRITE
    for (const auto& [base, length] : ranges_) {
      if (from >= length) continue;
      // Maps the pages without writing them: a step may be writing K/V into
      // the pages before `to` meanwhile (the kernel orders the two faults).
      if (madvise(base + from, std::min(to, length) - from, MADV_POPULATE_WRITE) != 0) {
        ok = false;  // EINVAL before Linux 5.14; ENOMEM, EFAULT, EHWPOISON: leave the rest to first writes
        break;
      }
    }
#else
    ok = false;
#endif
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (ok) {
        done_ = to;
      } else {
        failed_ = true;
      }
    }
    settled_.notify_all();
    if (!ok) return;
  }
}

}  // namespace troupe::model
