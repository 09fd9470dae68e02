// The router, batcher and worker actors wired together under CAF's
// deterministic test coordinator (no threads: messages run when the test runs
// them), with scripted workers (a core::SequenceTable each, no model): jobs
// stream their text to the client sink, two workers share the load, a worker
// that dies hands its requests to the other, status answers.
#include <gtest/gtest.h>

#include <map>
#include <memory>

#include "actors/batcher_actor.hpp"
#include "actors/router_actor.hpp"
#include "actors/worker_actor.hpp"
#include "caf/scheduler/test_coordinator.hpp"
#include "core/sequence_table.hpp"
#include "model/text/tokenizer.hpp"
#include "test_utils.hpp"

namespace troupe::actors {
namespace {

const model::Tokenizer& gpt2() {
  static const model::Tokenizer tok = model::Tokenizer::from_dir(troupe::test::tokenizer_dir());
  return tok;
}

// Token ids the scripted workers produce: " a b c d ..." (ids of single
// letters with a leading space), never eos.
int32_t script(uint64_t id, int32_t pos) {
  static const std::vector<int32_t> letters =
      gpt2().encode(" a b c d e f g h i j k l m n o p q r s t u v w x y z");
  return letters[static_cast<size_t>((id + static_cast<uint64_t>(pos)) % letters.size())];
}

core::SchedulerOptions worker_options() {
  core::SchedulerOptions o;
  o.num_blocks = 64;
  o.block_size = 4;
  o.max_model_len = 128;
  o.max_steps_in_flight = 2;
  return o;
}

StepRunner scripted_runner() {
  auto table = std::make_shared<core::SequenceTable>(core::SequenceTableOptions{64, 4, 128, 50257});
  return [table](const core::StepPlan& plan) {
    core::PreparedStep step = table->prepare(plan);
    core::StepResult r;
    r.step_id = plan.step_id;
    r.failures = step.failures;
    for (const auto& c : step.chunks) {
      if (c.sample) {
        r.outputs.push_back(
            {c.seq_id, {script(c.seq_id, c.start_pos + static_cast<int32_t>(c.token_ids.size())), 0.f, {}}});
      }
    }
    table->commit(step, r.outputs, {});
    return r;
  };
}

caf::actor_system_config& testing_config(caf::actor_system_config& cfg) {
  cfg.set("scheduler.policy", caf::atom("testing"));
  cfg.set("logger.inline-output", true);
  return cfg;
}

class ActorsTest : public ::testing::Test {
 protected:
  ActorsTest()
      : sys(testing_config(cfg)), sched(dynamic_cast<caf::scheduler::test_coordinator&>(sys.scheduler())) {
    batcher = spawn_batcher(sys, core::BatcherOptions{});
    router = spawn_router(sys, gpt2(), RouterOptions{}, batcher,
                          [this](const Reply& r) { replies[r.client.peer].push_back(r.message); });
    caf::anon_send(batcher, listen_atom::value, router, caf::actor{});
    sched.run();
  }
  ~ActorsTest() override {
    for (auto& w : workers) caf::anon_send_exit(w, caf::exit_reason::user_shutdown);
    caf::anon_send_exit(router, caf::exit_reason::user_shutdown);
    caf::anon_send_exit(batcher, caf::exit_reason::user_shutdown);
    sched.run();
  }

  worker_actor add_worker(uint64_t id) {
    worker_actor w = spawn_worker(sys, WorkerParams{scripted_runner, /*detached=*/false}, batcher);
    workers.push_back(w);
    caf::scoped_actor self{sys};
    core::WorkerSpec spec{id, "test", "scripted", worker_options()};
    self->send(batcher, wjoin_atom::value, spec, w);
    sched.run();
    return w;
  }

  void submit(const std::string& client, uint64_t tag, const std::string& prompt, int32_t max_tokens) {
    Job j;
    j.tag = tag;
    j.prompt = prompt;
    j.max_tokens = max_tokens;
    caf::anon_send(router, submit_atom::value, ClientId::zmq(client), j);
  }

  // The text and final message a client received for a tag.
  std::pair<std::string, const Finished*> outcome(const std::string& client, uint64_t tag) const {
    std::string text;
    const Finished* fin = nullptr;
    auto it = replies.find(client);
    if (it == replies.end()) return {text, fin};
    for (const auto& m : it->second) {
      if (auto* d = std::get_if<Tokens>(&m); d && d->tag == tag) text += d->text;
      if (auto* f = std::get_if<Finished>(&m); f && f->tag == tag) {
        text += f->text;
        fin = f;
      }
    }
    return {text, fin};
  }

  std::string expected(uint64_t request_id, int32_t prompt_len, int32_t n) const {
    std::vector<int32_t> ids;
    for (int32_t k = 0; k < n; ++k) ids.push_back(script(request_id, prompt_len + k));
    return gpt2().decode(ids);
  }

  uint64_t request_id(const std::string& client, uint64_t tag) const {
    for (const auto& m : replies.at(client))
      if (auto* a = std::get_if<Accepted>(&m); a && a->tag == tag) return a->request_id;
    return 0;
  }

  caf::actor_system_config cfg;
  caf::actor_system sys;
  caf::scheduler::test_coordinator& sched;
  batcher_actor batcher;
  router_actor router;
  std::vector<worker_actor> workers;
  std::map<std::string, std::vector<ClientMessage>> replies;
};

TEST_F(ActorsTest, JobsStreamTheirTextThroughTwoWorkers) {
  add_worker(1);
  add_worker(2);
  const int32_t plen = static_cast<int32_t>(gpt2().encode("Tell me").size());
  for (uint64_t tag = 1; tag <= 4; ++tag) submit("client", tag, "Tell me", 6);
  sched.run();
  for (uint64_t tag = 1; tag <= 4; ++tag) {
    auto [text, fin] = outcome("client", tag);
    ASSERT_NE(fin, nullptr) << tag;
    EXPECT_EQ(fin->finish_reason, core::FinishReason::kLength);
    EXPECT_EQ(fin->usage.completion_tokens, 6);
    EXPECT_EQ(text, expected(request_id("client", tag), plen, 6)) << tag;
  }
}

TEST_F(ActorsTest, ADeadWorkersRequestsFinishOnTheOtherWithNothingRepeated) {
  add_worker(1);
  worker_actor doomed = add_worker(2);
  const int32_t plen = static_cast<int32_t>(gpt2().encode("Go on").size());
  for (uint64_t tag = 1; tag <= 4; ++tag) submit("c", tag, "Go on", 12);
  // Run a few messages only, so that requests are mid-stream on both workers.
  for (int i = 0; i < 40 && sched.has_job(); ++i) sched.run_once();
  int mid_stream = 0;
  for (uint64_t tag = 1; tag <= 4; ++tag) {
    auto [text, fin] = outcome("c", tag);
    mid_stream += !text.empty() && fin == nullptr;
  }
  ASSERT_GE(mid_stream, 2) << "the kill must land mid-stream";
  caf::anon_send_exit(doomed, caf::exit_reason::kill);
  sched.run();
  caf::anon_send(router, status_atom::value, ClientId::zmq("s"));
  sched.run();
  const auto* st = std::get_if<StatusReport>(&replies["s"].at(0));
  ASSERT_NE(st, nullptr);
  ASSERT_EQ(st->batcher.workers.size(), 1u);
  EXPECT_EQ(st->batcher.workers[0].id, 1u);
  EXPECT_GT(st->batcher.workers[0].tokens_generated, 24)
      << "worker 1 recomputed and finished worker 2's requests";
  for (uint64_t tag = 1; tag <= 4; ++tag) {
    auto [text, fin] = outcome("c", tag);
    ASSERT_NE(fin, nullptr) << tag;
    EXPECT_EQ(fin->finish_reason, core::FinishReason::kLength) << tag;
    EXPECT_EQ(text, expected(request_id("c", tag), plen, 12)) << "tag " << tag;
  }
}

// A worker whose result breaks the protocol (a token outside the vocabulary)
// is dropped, and membership hears which and why (the head logs it and tells
// the node to shut down); its request finishes on the other worker.
TEST_F(ActorsTest, ABrokenResultDropsItsWorkerAndMembershipHearsWhy) {
  std::vector<std::pair<uint64_t, std::string>> dropped;
  // (One argument: CAF 0.17 dereferences a null argument tuple for a function actor without any, UBSan says.)
  caf::actor membership = sys.spawn(
      [&](caf::event_based_actor*, int) -> caf::behavior {
        return {[&](wleft_atom, uint64_t id, int32_t why, const std::string& detail) {
          EXPECT_EQ(why, static_cast<int32_t>(core::WorkerExit::kBroken));
          dropped.emplace_back(id, detail);
        }};
      },
      0);
  caf::anon_send(batcher, listen_atom::value, router, membership);
  sched.run();
  auto broken = [] {
    StepRunner good = scripted_runner();
    return [good](const core::StepPlan& plan) {
      core::StepResult r = good(plan);
      for (auto& o : r.outputs) o.token.id = 99999;
      return r;
    };
  };
  worker_actor bad = spawn_worker(sys, WorkerParams{broken, /*detached=*/false}, batcher);
  workers.push_back(bad);
  {
    caf::scoped_actor self{sys};
    self->send(batcher, wjoin_atom::value, core::WorkerSpec{7, "test", "scripted", worker_options()}, bad);
  }
  sched.run();
  submit("c", 1, "Hi", 3);
  sched.run();
  ASSERT_EQ(dropped.size(), 1u);
  EXPECT_EQ(dropped[0].first, 7u);
  EXPECT_NE(dropped[0].second.find("99999"), std::string::npos) << dropped[0].second;
  add_worker(8);
  sched.run();
  auto [text, fin] = outcome("c", 1);
  ASSERT_NE(fin, nullptr);
  EXPECT_EQ(fin->usage.completion_tokens, 3);
  caf::anon_send_exit(membership, caf::exit_reason::user_shutdown);
}

TEST_F(ActorsTest, WithoutWorkersJobsWaitForOne) {
  submit("c", 1, "Later", 3);
  sched.run();
  EXPECT_EQ(outcome("c", 1).second, nullptr);
  add_worker(5);
  sched.run();
  auto [text, fin] = outcome("c", 1);
  ASSERT_NE(fin, nullptr);
  EXPECT_EQ(fin->usage.completion_tokens, 3);
}

TEST_F(ActorsTest, StatusReportsWorkersAndCounters) {
  add_worker(1);
  submit("c", 1, "Hi", 2);
  sched.run();
  caf::anon_send(router, status_atom::value, ClientId::zmq("s"));
  sched.run();
  ASSERT_EQ(replies["s"].size(), 1u);
  const auto* st = std::get_if<StatusReport>(&replies["s"][0]);
  ASSERT_NE(st, nullptr);
  ASSERT_EQ(st->batcher.workers.size(), 1u);
  EXPECT_EQ(st->batcher.workers[0].id, 1u);
  EXPECT_EQ(st->router.accepted, 1);
  EXPECT_EQ(st->router.finished, 1);
  EXPECT_EQ(st->router.workers, 1);
}

}  // namespace
}  // namespace troupe::actors
