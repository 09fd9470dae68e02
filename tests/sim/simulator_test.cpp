// The simulator on cases with known answers: event order, one request's
// timeline (local, remote, two steps in flight), concurrency limits,
// clipping, prefix sharing across requests, preemption, determinism, and an
// M/D/1 queue.
#include "cluster/sim/simulator.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <sstream>
#include <tuple>

#include "cluster/sim/cost_profile.hpp"
#include "cluster/sim/event_queue.hpp"
#include "cluster/sim/sim_report.hpp"
#include "sim_test_utils.hpp"

namespace troupe::cluster::sim {
namespace {

using test::constant_cost;
using test::request;
using test::worker;

constexpr int64_t kMs = 1'000'000;


TEST(EventQueue, TiesBreakByKindThenPushOrder) {
  EventQueue q;
  q.push(5, EventKind::kSample, 0);
  q.push(5, EventKind::kArrival, 1);
  q.push(5, EventKind::kArrival, 2);
  q.push(5, EventKind::kStepDone, 3);
  q.push(4, EventKind::kSample, 4);
  q.push(5, EventKind::kResultArrive, 5);
  q.push(5, EventKind::kPlanArrive, 6);
  std::vector<uint64_t> order;
  while (!q.empty()) order.push_back(q.pop().target);
  EXPECT_EQ(order, (std::vector<uint64_t>{4, 3, 6, 5, 1, 2, 0}));
  EXPECT_EQ(q.pushed(), 7u);
}

// Random pushes and pops, many ties: every pop is the earliest event left by
// (time, kind, push order), as a sorted reference says (the heap is sifted up
// by hand and popped by std::pop_heap: the two must agree on its layout).
TEST(EventQueue, RandomPushesAndPopsComeOutInOrder) {
  std::mt19937_64 rng(7);
  EventQueue q;
  std::vector<Event> ref;  // what the queue holds
  uint64_t pushes = 0, pops = 0;
  for (int op = 0; op < 20000; ++op) {
    if (ref.empty() || rng() % 3 != 0) {
      const auto t = static_cast<int64_t>(rng() % 50);
      const auto kind = static_cast<EventKind>(rng() % 9);
      ref.push_back({t, kind, q.pushed(), pushes});
      q.push(t, kind, pushes++);
    } else {
      const auto first = std::min_element(ref.begin(), ref.end(), [](const Event& a, const Event& b) {
        return std::tie(a.time, a.kind, a.order) < std::tie(b.time, b.kind, b.order);
      });
      ASSERT_NE(q.peek(), nullptr);
      EXPECT_EQ(q.peek()->target, first->target);
      const Event e = q.pop();
      ASSERT_EQ(e.target, first->target) << "pop " << pops;
      EXPECT_EQ(e.time, first->time);
      EXPECT_EQ(e.order, first->order);
      ref.erase(first);
      ++pops;
    }
    ASSERT_EQ(q.size(), ref.size());
  }
  EXPECT_GT(pops, 5000u);
}

// The same events, the arrivals given as a list instead of pushed first:
// the same order, however they tie with the heap's events.
TEST(EventQueue, ArrivalListPopsAsIfPushedFirst) {
  const std::vector<int64_t> arrivals = {1, 5, 5, 7, 9};
  auto events = [](EventQueue& q) {
    q.push(5, EventKind::kSample, 10);
    q.push(5, EventKind::kStepDone, 11);
    q.push(7, EventKind::kArrival, 12);  // an arrival pushed later: after the listed ones at 7
    q.push(9, EventKind::kSample, 13);
    q.push(0, EventKind::kDeadline, 14);
    q.push(7, EventKind::kResultArrive, 15);
  };
  auto drain = [](EventQueue& q) {
    std::vector<std::pair<uint64_t, uint64_t>> out;  // (target, order)
    while (!q.empty()) {
      const Event e = q.pop();
      out.emplace_back(e.target, e.order);
    }
    return out;
  };
  EventQueue pushed, listed;
  for (size_t i = 0; i < arrivals.size(); ++i) pushed.push(arrivals[i], EventKind::kArrival, i);
  events(pushed);
  listed.set_arrivals(arrivals);
  EXPECT_EQ(listed.size(), 5u);
  events(listed);
  EXPECT_EQ(listed.size(), 11u);
  EXPECT_EQ(listed.pushed(), pushed.pushed());
  const auto want = drain(pushed);
  EXPECT_EQ(drain(listed), want);
  const std::vector<uint64_t> targets = {14, 0, 11, 1, 2, 10, 15, 3, 12, 4, 13};
  for (size_t i = 0; i < targets.size(); ++i) EXPECT_EQ(want[i].first, targets[i]) << i;

  EventQueue unsorted;
  EXPECT_THROW(unsorted.set_arrivals({3, 2}), std::invalid_argument);
  EventQueue late;
  late.push(1, EventKind::kSample, 0);
  EXPECT_THROW(late.set_arrivals({3}), std::invalid_argument);
}

TEST(Simulator, OneRequestOnALocalWorker) {
  // Step time S. Two steps in flight: the prefill and the first decode go at
  // once and run back to back, so the k-th token arrives at k*S.
  SimOptions o;
  o.workers = {worker(constant_cost(10 * kMs))};
  const SimResult r = simulate({request(0, 40, 5)}, o);
  ASSERT_EQ(r.requests.size(), 1u);
  const auto& t = r.requests[0];
  ASSERT_TRUE(t.success) << t.error;
  EXPECT_EQ(t.output_tokens, 5);
  EXPECT_EQ(t.token_ns.to_vector(), (std::vector<int64_t>{10 * kMs, 20 * kMs, 30 * kMs, 40 * kMs, 50 * kMs}));
  EXPECT_EQ(t.end_ns, 50 * kMs);
  EXPECT_EQ(r.scheduled_ns[0], 0);
  EXPECT_EQ(r.workers[0].steps, 5);
  EXPECT_EQ(r.workers[0].busy_ns, 50 * kMs);
  EXPECT_EQ(r.workers[0].tokens_run, 40 + 4);
  EXPECT_EQ(r.workers[0].refused_items, 0);
}

TEST(Simulator, RemoteWorkerPaysTheRoundTrip) {
  // Latency L each way, no bandwidth limit. With L small (2L < S) the second
  // plan is always there in time: token k at 2L + k*S.
  SimOptions o;
  SimWorkerSpec w = worker(constant_cost(10 * kMs));
  w.link.latency_ns = 2 * kMs;
  o.workers = {w};
  SimResult r = simulate({request(0, 40, 4)}, o);
  EXPECT_EQ(r.requests[0].token_ns.to_vector(),
            (std::vector<int64_t>{14 * kMs, 24 * kMs, 34 * kMs, 44 * kMs}));
  // With L = 3S the pipeline holds two steps per round trip 2L + S: one token
  // every (2L + S) / 2 = 3.5 S after the first.
  o.workers[0].link.latency_ns = 30 * kMs;
  r = simulate({request(0, 40, 5)}, o);
  const std::vector<int64_t> t = r.requests[0].token_ns.to_vector();
  ASSERT_EQ(t.size(), 5u);
  EXPECT_EQ(t[0], 70 * kMs);
  EXPECT_EQ(t[1], 80 * kMs);  // the second plan went out at 0 with the first
  EXPECT_EQ(t[2] - t[0], 70 * kMs);
  EXPECT_EQ(t[3] - t[1], 70 * kMs);
}

TEST(Simulator, BandwidthDelaysBigPlans) {
  // 40 prompt tokens over 1 MB/s: the first plan carries them (a few hundred
  // bytes of msgpack), so the first token comes later than over a link of
  // latency alone by (plan bytes + result bytes) / bandwidth.
  SimOptions o;
  SimWorkerSpec w = worker(constant_cost(10 * kMs));
  w.link.latency_ns = kMs;
  o.workers = {w};
  const int64_t latency_only = simulate({request(0, 40, 1)}, o).requests[0].token_ns.front();
  EXPECT_EQ(latency_only, kMs + 10 * kMs + kMs);
  o.workers[0].link.bandwidth_bytes_per_s = 1e6;
  const int64_t metered = simulate({request(0, 40, 1)}, o).requests[0].token_ns.front();
  // The same plan's size, built by hand: 40 ids of at most 5 bytes each.
  core::StepPlan p;
  p.new_seqs.push_back({1, std::vector<int32_t>(40, 50000), 0, {0, 1, 2}, {}});
  p.work.push_back({1, 0, 40, {}, true});
  core::StepResult res;
  res.outputs.push_back({1, {50000, 0, {}}});
  const int64_t at_most = o.workers[0].link.serialization_ns(plan_wire_bytes(p) + result_wire_bytes(res));
  const int64_t bytes_ns = metered - latency_only;  // 1 byte = 1 us
  EXPECT_GT(bytes_ns, 40'000 + 20'000) << "40 token ids and the frame around them";
  EXPECT_LE(bytes_ns, at_most + 2'000);
}

TEST(Channel, SerialisesMessagesInOrder) {
  NetworkLink l;
  l.latency_ns = 100;
  l.bandwidth_bytes_per_s = 1e9;  // 1 byte per ns
  Channel c;
  EXPECT_EQ(c.send(0, 50, l), 150);
  EXPECT_EQ(c.send(10, 50, l), 200);  // waits for the first to leave the wire
  EXPECT_EQ(c.send(500, 10, l), 610);
}

TEST(Simulator, ConcurrencyLimitMakesAClosedLoop) {
  SimOptions o;
  o.workers = {worker(constant_cost(kMs))};
  o.max_concurrency = 1;
  std::vector<WorkloadRequest> w(4, request(0, 8, 3));
  const SimResult r = simulate(w, o);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(r.requests[i].start_ns, static_cast<int64_t>(i) * 3 * kMs)
        << i;  // sent when the last one ended
    EXPECT_EQ(r.requests[i].end_ns - r.requests[i].start_ns, 3 * kMs) << i;
  }
  o.max_concurrency = 0;  // all at once: they share steps
  const SimResult all = simulate(w, o);
  for (const auto& t : all.requests) EXPECT_EQ(t.start_ns, 0);
  EXPECT_LT(all.end_ns, r.end_ns);
}

TEST(Simulator, OverlongRequestsAreClippedOrFail) {
  SimOptions o;
  o.workers = {worker(constant_cost(kMs), 256, 64)};
  std::vector<WorkloadRequest> w = {request(0, 100, 10), request(0, 30, 10), request(0, 5, 80)};
  SimResult r = simulate(w, o);
  EXPECT_EQ(r.clipped, 2);
  EXPECT_EQ(r.requests[0].prompt_tokens, 54);  // 64 - 10
  EXPECT_EQ(r.requests[0].output_tokens, 10);
  EXPECT_EQ(r.requests[2].prompt_tokens, 1);
  EXPECT_EQ(r.requests[2].output_tokens, 63);
  for (const auto& t : r.requests) EXPECT_TRUE(t.success) << t.error;
  o.overlong = OverlongPolicy::kFail;
  r = simulate(w, o);
  EXPECT_FALSE(r.requests[0].success);
  EXPECT_NE(r.requests[0].error.find("max_model_len"), std::string::npos) << r.requests[0].error;
  EXPECT_TRUE(r.requests[1].success);
  EXPECT_FALSE(r.requests[2].success);
}

TEST(Simulator, SharedTraceBlocksHitThePrefixCache) {
  SimOptions o;
  o.workers = {worker(constant_cost(kMs)), worker(constant_cost(kMs))};
  o.prompts.trace_block_tokens = 32;
  WorkloadRequest a = request(0, 100, 2), b = request(50 * kMs, 90, 2), c = request(60 * kMs, 90, 2);
  a.hash_ids = {1, 2, 3, 4};
  b.hash_ids = {1, 2, 5};
  c.hash_ids = {6, 2, 3};  // block 2 equal to a's, but after a different first block: no hit
  const SimResult r = simulate({a, b, c}, o);
  EXPECT_EQ(r.cached_tokens[0], 0);
  EXPECT_EQ(r.cached_tokens[1], 64);  // two 32-token trace blocks = 4 KV blocks of 16
  EXPECT_EQ(r.cached_tokens[2], 0);
  EXPECT_EQ(r.worker[1], r.worker[0]);  // prefix affinity sent it where the prefix lives
}

TEST(Simulator, PreemptionUnderKvPressureLosesNothing) {
  SimOptions o;
  o.workers = {worker(constant_cost(kMs), 12)};  // 12 blocks of 16 tokens
  std::vector<WorkloadRequest> w;
  for (int i = 0; i < 6; ++i) w.push_back(request(i * kMs / 10, 20, 40));
  const SimResult r = simulate(w, o);
  EXPECT_GT(r.workers[0].preemptions, 0);
  for (const auto& t : r.requests) {
    EXPECT_TRUE(t.success) << t.error;
    EXPECT_EQ(t.output_tokens, 40);
    EXPECT_EQ(t.token_ns.size(), 40u);
  }
  EXPECT_EQ(r.workers[0].tokens_generated, 240);
  EXPECT_EQ(r.workers[0].refused_items, 0);
}

// --step-log: every simulated step, its shape and predicted time, in the
// served log's format (so profile --calibrate-with and a comparison read it).
TEST(Simulator, StepLogHasEveryStepWithItsPredictedTime) {
  auto cost = std::make_shared<CostModel>();
  cost->knots = {1, 64};
  cost->knot_ns = {2 * kMs, 9 * kMs};
  cost->decode_pair_ns = 1000;
  SimOptions o;
  o.workers = {worker(cost), worker(cost)};
  auto text = std::make_shared<std::ostringstream>();
  o.step_log = std::make_shared<core::StepLog>(text);
  std::vector<WorkloadRequest> w;
  for (int i = 0; i < 8; ++i) w.push_back(request(i * 3 * kMs, 30 + 7 * i, 5 + i));
  const SimResult r = simulate(w, o);
  EXPECT_EQ(o.step_log->pending(), 0u);
  test::TempFile f(text->str(), ".jsonl");
  const std::vector<CostSample> steps = read_step_log(f.path);
  int64_t want_steps = 0, want_tokens = 0, tokens = 0;
  double busy_ns = 0;
  for (const auto& wr : r.workers) {
    want_steps += wr.steps;
    want_tokens += wr.tokens_run;
    busy_ns += static_cast<double>(wr.busy_ns);
  }
  ASSERT_EQ(static_cast<int64_t>(steps.size()), want_steps);
  double ns = 0;
  for (const CostSample& c : steps) {
    EXPECT_NEAR(c.ns, static_cast<double>(cost->predict_ns(c.shape)), 100);  // ms with 4 decimals
    tokens += c.shape.tokens;
    ns += c.ns;
  }
  EXPECT_EQ(tokens, want_tokens);
  EXPECT_NEAR(ns, busy_ns, 100.0 * static_cast<double>(steps.size()));
  EXPECT_NE(text->str().find("\"worker\":2"), std::string::npos) << "both workers' steps";
}

TEST(Simulator, TimeSeriesAccountsForTheRun) {
  SimOptions o;
  o.workers = {worker(constant_cost(5 * kMs)), worker(constant_cost(5 * kMs))};
  o.sample_interval_ns = 20 * kMs;
  std::vector<WorkloadRequest> w;
  for (int i = 0; i < 20; ++i) w.push_back(request(i * 7 * kMs, 30, 10));
  const SimResult r = simulate(w, o);
  ASSERT_FALSE(r.series.empty());
  int64_t tokens = 0, finished = 0;
  for (const auto& p : r.series) {
    tokens += p.output_tokens;
    finished += p.finished;
    ASSERT_EQ(p.workers.size(), 2u);
    for (const auto& x : p.workers) {
      EXPECT_GE(x.busy, 0);
      EXPECT_LE(x.busy, 1 + 1e-12);
    }
  }
  EXPECT_EQ(tokens, 200);
  EXPECT_EQ(finished, 20);
  EXPECT_EQ(r.series.back().t_ns, r.end_ns);
  int64_t busy = 0;
  for (const auto& x : r.workers) busy += x.busy_ns;
  double busy_from_series = 0;
  int64_t prev = 0;
  for (const auto& p : r.series) {
    for (const auto& x : p.workers) busy_from_series += x.busy * static_cast<double>(p.t_ns - prev);
    prev = p.t_ns;
  }
  EXPECT_NEAR(busy_from_series, static_cast<double>(busy), 1e3);
}

TEST(Simulator, RejectsBadOptions) {
  SimOptions o;
  EXPECT_THROW(simulate({request(0, 1, 1)}, o), std::invalid_argument);  // no workers
  o.workers = {worker(nullptr)};
  EXPECT_THROW(simulate({request(0, 1, 1)}, o), std::invalid_argument);
  o.workers = {worker(constant_cost(kMs))};
  EXPECT_THROW(simulate({}, o), std::invalid_argument);
  EXPECT_THROW(simulate({request(5, 1, 1), request(0, 1, 1)}, o), std::invalid_argument);  // out of order
  EXPECT_THROW(simulate({request(0, 0, 1)}, o), std::invalid_argument);
}

TEST(Simulator, ShortcutsChangeNothing) {
  // Planning only the workers that changed (Batcher::schedule(now, worker))
  // must plan exactly what planning every worker would, and running plans
  // without worker tables must give what the tables give: compare whole
  // runs, with preemption, network and a concurrency limit in play.
  SyntheticOptions so;
  so.num_requests = 300;
  so.request_rate = 400;
  so.seed = 5;
  so.input = parse_length_distribution("uniform:60:0.8");
  so.output = parse_length_distribution("uniform:30:0.9");
  const auto w = generate_synthetic(so);
  SimOptions o;
  for (int i = 0; i < 3; ++i) {
    SimWorkerSpec x = worker(constant_cost((2 + i) * kMs), 24);
    x.link.latency_ns = i * 300'000;
    o.workers.push_back(x);
  }
  o.max_concurrency = 40;
  o.batcher.placement = core::PlacementPolicy::kLeastLoaded;
  const SimResult some = simulate(w, o);
  o.schedule_all_workers = true;
  const SimResult all = simulate(w, o);
  o.schedule_all_workers = false;
  o.tables_on_thread = true;  // the tables checked on a thread, the plans run as they stand
  const SimResult threaded = simulate(w, o);
  o.tables_on_thread = false;
  o.worker_tables = false;  // plans run as they stand: the same tokens at the same times
  const SimResult untabled = simulate(w, o);
  int64_t preemptions = 0;
  for (const auto& x : some.workers) preemptions += x.preemptions;
  EXPECT_GT(preemptions, 0);
  ASSERT_EQ(some.requests.size(), all.requests.size());
  for (size_t i = 0; i < w.size(); ++i) {
    EXPECT_EQ(some.requests[i].token_ns, all.requests[i].token_ns) << i;
    EXPECT_EQ(some.requests[i].start_ns, all.requests[i].start_ns) << i;
    EXPECT_EQ(some.worker[i], all.worker[i]) << i;
    EXPECT_EQ(some.requests[i].token_ns, untabled.requests[i].token_ns) << i;
    EXPECT_EQ(some.requests[i].token_ns, threaded.requests[i].token_ns) << i;
    EXPECT_EQ(some.worker[i], threaded.worker[i]) << i;
  }
  ASSERT_EQ(some.workers.size(), threaded.workers.size());
  for (size_t i = 0; i < some.workers.size(); ++i) {
    EXPECT_EQ(some.workers[i].steps, threaded.workers[i].steps);
    EXPECT_EQ(some.workers[i].refused_items, 0);
    EXPECT_EQ(threaded.workers[i].refused_items, 0);
  }
}

TEST(Simulator, ARefusalOnTheTableThreadRunsTheTablesInLine) {
  // A worker whose own pool is smaller than the one its scheduler plans with
  // (table_blocks): its table refuses every item that names a block it does
  // not have, and those requests fail. With the tables on a thread the
  // simulation first runs the plans as they stand; the refusal must send it
  // back to a run with the tables in line, whose result it returns: the same
  // failures, the same refusal counts, the same times.
  SyntheticOptions so;
  so.num_requests = 60;
  so.request_rate = 200;
  so.seed = 9;
  so.input = parse_length_distribution("uniform:40:0.5");
  so.output = parse_length_distribution("uniform:20:0.5");
  const auto w = generate_synthetic(so);
  SimOptions o;
  o.workers = {worker(constant_cost(2 * kMs), 24), worker(constant_cost(3 * kMs), 24)};
  o.workers[1].table_blocks = 6;
  const SimResult in_line = simulate(w, o);
  o.tables_on_thread = true;
  const SimResult threaded = simulate(w, o);
  EXPECT_EQ(in_line.workers[0].refused_items, 0);
  EXPECT_GT(in_line.workers[1].refused_items, 0);
  int failed = 0;
  for (const auto& r : in_line.requests) failed += r.success ? 0 : 1;
  EXPECT_GT(failed, 0);
  ASSERT_EQ(in_line.workers.size(), threaded.workers.size());
  for (size_t i = 0; i < in_line.workers.size(); ++i) {
    EXPECT_EQ(in_line.workers[i].refused_items, threaded.workers[i].refused_items) << i;
    EXPECT_EQ(in_line.workers[i].steps, threaded.workers[i].steps) << i;
  }
  ASSERT_EQ(in_line.requests.size(), threaded.requests.size());
  for (size_t i = 0; i < w.size(); ++i) {
    EXPECT_EQ(in_line.requests[i].success, threaded.requests[i].success) << i;
    EXPECT_EQ(in_line.requests[i].error, threaded.requests[i].error) << i;
    EXPECT_EQ(in_line.requests[i].token_ns, threaded.requests[i].token_ns) << i;
  }
  o.workers[1].table_blocks = -1;
  EXPECT_THROW(simulate(w, o), std::invalid_argument);
}

TEST(Simulator, MD1QueueWaitMatchesTheFormula) {
  // One worker taking one request at a time (max_num_seqs 1), each needing a
  // single step of S (one output token): an M/D/1 queue. Its mean wait is
  // rho * S / (2 (1 - rho)) (Pollaczek-Khinchine). Waits are correlated, so
  // the tolerance comes from batch means: 4 standard errors of 40 batches.
  const double S = 10e6, rho = 0.5;
  SimOptions o;
  SimWorkerSpec w = worker(constant_cost(S));
  w.scheduler.max_num_seqs = 1;
  o.workers = {w};
  o.sample_interval_ns = 0;
  const SimResult r = simulate(test::one_token_requests(40000, rho / (S / 1e9), 21), o);
  std::vector<double> waits;
  for (const auto& t : r.requests) {
    ASSERT_TRUE(t.success);
    waits.push_back(static_cast<double>(t.token_ns.front() - t.start_ns) - S);  // TTFT = wait + S
  }
  const test::BatchMeans m = test::batch_means(waits);
  const double expected = rho * S / (2 * (1 - rho));
  RecordProperty("mean_wait_ns", std::to_string(m.mean));
  RecordProperty("standard_error_ns", std::to_string(m.se));
  EXPECT_LT(m.se, 0.05 * expected);  // the test can tell a wrong queue from a right one
  EXPECT_NEAR(m.mean, expected, 4 * m.se) << "se " << m.se;
}

}  // namespace
}  // namespace troupe::cluster::sim

namespace troupe::cluster::sim {
namespace {

using test::fault_workload;
using test::four_workers;
using test::json_of;

// A killed worker: the batcher's remove_worker moves its unfinished requests
// (counted, recomputed), nothing is lost, the worker runs nothing after, and
// the run is a pure function of its inputs.
TEST(SimulatorFaults, AKilledWorkersRequestsMoveAndFinishElsewhere) {
  const auto w = fault_workload();
  SimOptions o = four_workers();
  const SimResult plain = simulate(w, o);
  o.faults = {{FaultKind::kKill, 2, 1'000 * kMs}};
  o.node_loss_ns = 0;  // noticed at once (the default waits for missed heartbeats: below)
  const SimResult r = simulate(w, o);
  ASSERT_EQ(r.faults.size(), 1u);
  const FaultReport& f = r.faults[0];
  EXPECT_EQ(f.removed_ns, 1'000 * kMs);
  EXPECT_GT(f.requests_moved, 0);
  EXPECT_GT(f.tokens_recomputed, 0);
  int affected = 0;
  for (size_t i = 0; i < w.size(); ++i) {
    EXPECT_TRUE(r.requests[i].success) << i << ": " << r.requests[i].error;
    EXPECT_EQ(r.requests[i].output_tokens, plain.requests[i].output_tokens) << i;
    affected += r.affected[i];
  }
  EXPECT_EQ(affected, f.requests_moved);
  EXPECT_LE(r.workers[1].busy_ns, 1'000 * kMs) << "a killed worker computes nothing after its death";
  EXPECT_LT(r.workers[1].steps, plain.workers[1].steps);
  // Deterministic with events, and byte-identical reports.
  EXPECT_EQ(json_of(simulate(w, o)), json_of(r));
  EXPECT_NE(json_of(r), json_of(plain));
  const std::string text = format_fault_summary(r);
  EXPECT_NE(text.find("kill  worker 2 at 1.000 s: gone at 1.000 s, " + std::to_string(f.requests_moved) +
                      " requests moved"),
            std::string::npos)
      << text;
  EXPECT_EQ(format_fault_summary(plain), "");
}

// A killed worker is noticed when its heartbeats stop (node_loss_ns later):
// it computes nothing after its death, plans still go to it until then, and
// more requests move than when it is noticed at once.
TEST(SimulatorFaults, AKilledWorkerIsNoticedWhenItsHeartbeatsStop) {
  const auto w = fault_workload();
  SimOptions o = four_workers();
  o.faults = {{FaultKind::kKill, 2, 1'000 * kMs}};
  o.node_loss_ns = 0;
  const SimResult at_once = simulate(w, o);
  o.node_loss_ns = 1'500 * kMs;
  const SimResult r = simulate(w, o);
  EXPECT_EQ(r.faults[0].removed_ns, 2'500 * kMs);
  EXPECT_GT(r.faults[0].requests_moved, at_once.faults[0].requests_moved);
  EXPECT_LE(r.workers[1].busy_ns, 1'000 * kMs);
  for (size_t i = 0; i < w.size(); ++i) EXPECT_TRUE(r.requests[i].success) << i;
  int64_t stalled = 0;  // requests on the dead worker: no token between its death and its notice
  for (size_t i = 0; i < w.size(); ++i) {
    if (!r.affected[i]) continue;
    for (int64_t t : r.requests[i].token_ns.to_vector())
      EXPECT_FALSE(t > 1'000 * kMs + 5 * kMs && t < 2'500 * kMs) << i;
    ++stalled;
  }
  EXPECT_EQ(stalled, r.faults[0].requests_moved);
}

// A fault after the last request changes nothing about the requests.
TEST(SimulatorFaults, AFaultAfterTheRunChangesNoRequest) {
  const auto w = fault_workload();
  SimOptions o = four_workers();
  const SimResult plain = simulate(w, o);
  o.faults = {{FaultKind::kKill, 1, plain.end_ns + 1'000 * kMs}};
  const SimResult r = simulate(w, o);
  for (size_t i = 0; i < w.size(); ++i) EXPECT_EQ(r.requests[i].token_ns, plain.requests[i].token_ns) << i;
  EXPECT_EQ(r.faults[0].removed_ns, -1);
  EXPECT_EQ(r.faults[0].requests_moved, 0);
}

// A hung worker answers nothing until the step deadline (floor 2 s here)
// lets it go; its requests then move, and their latencies show the wait.
TEST(SimulatorFaults, AHungWorkerIsFoundOutByTheStepDeadline) {
  const auto w = fault_workload();
  SimOptions o = four_workers();
  o.batcher.step_timeout_floor_ns = 2'000 * kMs;
  o.watchdog_interval_ns = 100 * kMs;
  o.faults = {{FaultKind::kHang, 3, 1'000 * kMs}};
  const SimResult r = simulate(w, o);
  const FaultReport& f = r.faults[0];
  // Its oldest step began before the hang, or at most 5 ms after it (a step
  // takes 5 ms); the deadline is the floor; the watchdog ticks every 100 ms.
  EXPECT_GE(f.removed_ns, 2'995 * kMs);
  EXPECT_LE(f.removed_ns, 3'105 * kMs);
  EXPECT_GT(f.requests_moved, 0);
  for (size_t i = 0; i < w.size(); ++i) {
    EXPECT_TRUE(r.requests[i].success) << i;
    if (r.affected[i]) { EXPECT_GE(r.requests[i].end_ns, f.removed_ns) << i; }
  }
  const auto j = fault_json(r);
  EXPECT_GT(j["affected"]["median_e2el_ms"].get<double>(), j["unaffected"]["median_e2el_ms"].get<double>());
  EXPECT_EQ(json_of(simulate(w, o)), json_of(r));
  // As the real head restarts a local worker it let go as hung (under a new
  // id, an empty KV cache), the simulation does: worker 5 joins then and works.
  EXPECT_EQ(f.new_worker, 5u);
  EXPECT_EQ(f.returned_ns, f.removed_ns);
  ASSERT_EQ(r.workers.size(), 5u);
  EXPECT_GT(r.workers[4].steps, 0);
  EXPECT_EQ(j["faults"][0]["new_worker"].get<int>(), 5);
  EXPECT_NE(format_fault_summary(r).find(", back as worker 5 at "), std::string::npos) << format_fault_summary(r);
}

// A hung worker on a node: the head's reset crosses the link and the node
// registers again, one latency each way after the deadline let it go. Local
// workers are restarted at most three times a run, as the real head does.
TEST(SimulatorFaults, AHungNodeRegistersAgainAndLocalRestartsAreBounded) {
  const auto w = fault_workload();
  SimOptions o = four_workers();
  o.batcher.step_timeout_floor_ns = 2'000 * kMs;
  o.watchdog_interval_ns = 100 * kMs;
  o.workers[2].link.latency_ns = 30 * kMs;
  o.faults = {{FaultKind::kHang, 3, 1'000 * kMs}};
  const SimResult remote = simulate(w, o);
  ASSERT_GE(remote.faults[0].removed_ns, 0);
  EXPECT_EQ(remote.faults[0].returned_ns, remote.faults[0].removed_ns + 60 * kMs);
  EXPECT_EQ(remote.faults[0].new_worker, 5u);
  o.tables_on_thread = true;  // a worker joins: the tables are checked in line, the same result
  EXPECT_EQ(json_of(simulate(w, o)), json_of(remote));

  SimOptions local = four_workers();
  local.batcher.step_timeout_floor_ns = 2'000 * kMs;
  local.watchdog_interval_ns = 100 * kMs;
  for (uint64_t id = 1; id <= 4; ++id) local.faults.push_back({FaultKind::kHang, id, int64_t(id) * 300 * kMs});
  const SimResult r = simulate(w, local);
  for (size_t k = 0; k < 4; ++k) ASSERT_GE(r.faults[k].removed_ns, 0) << k;
  EXPECT_EQ(r.faults[0].new_worker, 5u);
  EXPECT_EQ(r.faults[1].new_worker, 6u);
  EXPECT_EQ(r.faults[2].new_worker, 7u);
  EXPECT_EQ(r.faults[3].new_worker, 0u) << "a fourth restart: none";
  for (size_t i = 0; i < w.size(); ++i) EXPECT_TRUE(r.requests[i].success) << i;
}

// A drained worker starts nothing new; the requests it had not started move,
// the rest finish there, and then it leaves.
TEST(SimulatorFaults, ADrainedWorkerFinishesItsRunningRequestsAndLeaves) {
  const auto w = fault_workload();
  SimOptions o = four_workers();
  o.faults = {{FaultKind::kDrain, 4, 1'000 * kMs}};
  const SimResult r = simulate(w, o);
  const FaultReport& f = r.faults[0];
  EXPECT_GT(f.removed_ns, 1'000 * kMs);
  EXPECT_EQ(f.tokens_recomputed, 0) << "a request that moves at a drain had not started";
  for (size_t i = 0; i < w.size(); ++i) {
    EXPECT_TRUE(r.requests[i].success) << i;
    if (r.requests[i].start_ns > 1'000 * kMs) { EXPECT_NE(r.worker[i], 4u) << i; }
  }
  EXPECT_LE(r.workers[3].busy_ns, f.removed_ns);
}

TEST(SimulatorFaults, FaultTextsAndBadFaults) {
  const SimFault f = parse_fault(FaultKind::kHang, "3@1.5");
  EXPECT_EQ(f.worker, 3u);
  EXPECT_EQ(f.at_ns, 1'500 * kMs);
  EXPECT_EQ(f.kind, FaultKind::kHang);
  for (const char* bad : {"3", "@5", "3@", "x@5", "0@5", "3@-1", "3@5s", "3@nan", "-1@2"})
    EXPECT_THROW(parse_fault(FaultKind::kKill, bad), std::invalid_argument) << bad;
  SimOptions o = four_workers();
  o.faults = {{FaultKind::kKill, 5, 0}};
  EXPECT_THROW(simulate(fault_workload(), o), std::invalid_argument);
}

}  // namespace
}  // namespace troupe::cluster::sim
