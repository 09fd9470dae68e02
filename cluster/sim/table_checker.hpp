#pragma once
// TableChecker: the simulated workers' SequenceTables, run on a thread of
// their own. Each plan a simulated worker starts is checked and resolved by
// its worker's table as a real worker would (core/sequence_table.hpp), and
// the step's sampled tokens appended, while the simulation goes on with the
// plan as it stands. That is the same run as checking in line as long as no
// table refuses a work item, which a correct scheduler never makes it do
// (`refused_items` is a protocol bug); when one does, finish() says so and
// the caller runs the simulation again with the tables in line, so that the
// refusal shapes the run as it would on a real worker. Nothing of the
// simulation's results comes from this thread: they are the same bits
// whatever its timing.
//
// Plans travel, copied, through a bounded single-producer, single-consumer
// ring whose slots keep their buffers: the simulation's own plans never
// cross to the other thread (their memory, freed and reused by the
// simulation, would travel back and forth between the CPUs' caches).
#include <atomic>
#include <cstdint>
#include <exception>
#include <memory>
#include <thread>
#include <vector>

#include "cluster/sim/simulator.hpp"
#include "core/sequence_table.hpp"
#include "core/step_plan.hpp"

namespace troupe::cluster::sim {

// The token a simulated worker "samples" for the item of `seq_id` that ends
// at `position`: any valid id will do (the simulator's requests ignore eos).
int32_t fake_token(uint64_t seq_id, int32_t position, int32_t vocab);

// Checks one plan on a worker's table as the real worker would and advances
// the table past the step, the tokens it samples being fake_token's
// (SequenceTable::advance: the same checks as prepare(), without building
// the chunks that only a model reads); false when the table refused an item
// (the caller then stops checking). `failures` is the caller's buffer, kept
// between plans.
bool check_plan(core::SequenceTable& table, const core::StepPlan& plan,
                std::vector<core::SeqFailure>& failures);

// A simulated worker's SequenceTable: its scheduler's pool, block size,
// positions and vocabulary (its own pool if table_blocks says so).
core::SequenceTableOptions table_options(const SimWorkerSpec& w);

class TableChecker {
 public:
  // One table per worker (index = worker id - 1). Starts the thread.
  explicit TableChecker(const std::vector<core::SequenceTableOptions>& workers);
  ~TableChecker();  // checks what is in the ring, then stops the thread
  TableChecker(const TableChecker&) = delete;
  TableChecker& operator=(const TableChecker&) = delete;

  // Hands a copy of worker `index`'s next plan over. Waits while the ring is
  // full. The copy goes into buffers the ring keeps (no allocation once they
  // have grown), so the caller's plans stay in its own thread's memory.
  void submit(size_t index, const core::StepPlan& plan);
  // Waits until every plan submitted has been checked and stops the thread.
  // True when every table accepted every work item; false when one refused
  // (checking stopped there). Rethrows what the thread threw.
  bool finish();

 private:
  struct Slot {
    size_t worker = 0;
    core::StepPlan plan;
  };
  void loop();
  void check(Slot& s);

  std::vector<core::SequenceTable> tables_;
  std::vector<Slot> ring_;  // a power of two
  // Plans submitted and checked so far (slot = count % size): written by one
  // side each.
  std::atomic<uint64_t> submitted_{0}, checked_{0};
  uint64_t checked_seen_ = 0;  // the submitting side's last reading of checked_
  std::atomic<bool> stop_{false}, refused_{false};
  std::exception_ptr error_;  // set by the thread before checked_ moves past its plan
  std::atomic<bool> failed_{false};
  std::vector<core::SeqFailure> failures_;  // the thread's
  bool finished_ = false;
  std::thread thread_;
};

}  // namespace troupe::cluster::sim
