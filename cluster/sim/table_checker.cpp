#include "cluster/sim/table_checker.hpp"

#include <chrono>

#include "core/splitmix.hpp"

namespace troupe::cluster::sim {
namespace {

constexpr size_t kRing = 1024;  // plans in flight between the threads at most

// Waits for `ready` to hold in short naps: the ring is deep, so neither side
// needs the other at once, and a napping side neither holds a CPU nor pulls
// the other's cache lines over at every plan.
template <typename Ready>
void wait_until(const Ready& ready) {
  while (!ready()) std::this_thread::sleep_for(std::chrono::microseconds(100));
}

}  // namespace

int32_t fake_token(uint64_t seq_id, int32_t position, int32_t vocab) {
  return static_cast<int32_t>(
      core::splitmix64(seq_id * 0x9e3779b97f4a7c15ULL + static_cast<uint64_t>(position)) %
      static_cast<uint64_t>(vocab));
}

core::SequenceTableOptions table_options(const SimWorkerSpec& w) {
  const core::SchedulerOptions& o = w.scheduler;
  core::SequenceTableOptions t;
  t.num_blocks = w.table_blocks > 0 ? w.table_blocks : o.num_blocks;
  t.block_size = o.block_size;
  t.max_positions = o.max_model_len;
  t.vocab_size = o.vocab_size;
  return t;
}

TableChecker::TableChecker(const std::vector<core::SequenceTableOptions>& workers) : ring_(kRing) {
  tables_.reserve(workers.size());
  for (const core::SequenceTableOptions& o : workers) tables_.emplace_back(o);
  thread_ = std::thread([this] { loop(); });
}

TableChecker::~TableChecker() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
}

void TableChecker::submit(size_t index, const core::StepPlan& plan) {
  const uint64_t n = submitted_.load(std::memory_order_relaxed);
  if (n - checked_seen_ >= kRing) {  // looks full: read how far the thread got (rarely)
    wait_until([&] { return n - (checked_seen_ = checked_.load(std::memory_order_acquire)) < kRing; });
  }
  Slot& s = ring_[n % kRing];
  s.worker = index;
  s.plan = plan;  // element by element into the slot's buffers
  submitted_.store(n + 1, std::memory_order_release);
}

void TableChecker::loop() {
  uint64_t n = 0;
  for (;;) {
    // A batch: every plan submitted by now (stop_ is read first, so a stop
    // seen with nothing new means nothing more will come).
    const bool stopping = stop_.load(std::memory_order_acquire);
    const uint64_t upto = submitted_.load(std::memory_order_acquire);
    if (upto == n) {
      if (stopping) return;
      // Long naps: the ring holds ~7 ms of a fast simulation's plans, and
      // each wake-up costs this CPU a timer interrupt and a system call.
      std::this_thread::sleep_for(std::chrono::microseconds(1000));
      continue;
    }
    for (; n < upto; ++n) {
      if (refused_.load(std::memory_order_relaxed) || failed_.load(std::memory_order_relaxed)) continue;
      try {
        check(ring_[n % kRing]);
      } catch (...) {
        error_ = std::current_exception();
        failed_ = true;
      }
    }
    checked_.store(n, std::memory_order_release);
  }
}

bool check_plan(core::SequenceTable& table, const core::StepPlan& plan,
                std::vector<core::SeqFailure>& failures) {
  const int32_t vocab = table.options().vocab_size;
  return table.advance(plan, failures,
                       [vocab](uint64_t seq, int32_t pos) { return fake_token(seq, pos, vocab); });
}

void TableChecker::check(Slot& s) {
  if (!check_plan(tables_.at(s.worker), s.plan, failures_)) refused_ = true;
}

bool TableChecker::finish() {
  if (!finished_) {
    const uint64_t n = submitted_.load(std::memory_order_relaxed);
    wait_until([&] { return checked_.load(std::memory_order_acquire) == n; });
    stop_ = true;
    thread_.join();
    finished_ = true;
  }
  if (error_) std::rethrow_exception(error_);
  return !refused_;
}

}  // namespace troupe::cluster::sim
