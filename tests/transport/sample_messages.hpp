#pragma once
// One message of every type with no field left at its default, so a field
// that encode() writes and decode() drops (or the reverse) changes the bytes.
// Shared by the round-trip tests, the mutation smoke test and the fuzzer seeds.
#include <cmath>
#include <limits>
#include <vector>

#include "transport/protocol.hpp"

namespace troupe::transport::test {

inline core::StepPlan sample_plan() {
  core::StepPlan p;
  p.step_id = 77;
  p.drop = {3, 1ull << 40};
  core::NewSequence ns;
  ns.seq_id = 9;
  ns.tokens = {50256, 0, 318, 1000000};
  ns.num_cached = 2;
  ns.block_table = {4, 5};
  ns.sampling.temperature = 0.7f;
  ns.sampling.top_k = 40;
  ns.sampling.top_p = 0.9f;
  ns.sampling.seed = 0xdeadbeefcafeull;
  ns.sampling.logprobs = 5;
  p.new_seqs.push_back(ns);
  // A resumed sequence that adjusts its logits: the optional elements.
  ns.seq_id = 12;
  ns.tokens = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17};
  ns.num_cached = 0;
  ns.num_generated = 7;
  ns.block_table = {7, 8};
  ns.sampling.presence_penalty = 0.5f;
  ns.sampling.frequency_penalty = -1.25f;
  ns.sampling.logit_bias = {{3, -100.0f}, {50256, 7.5f}};
  ns.sampling.repetition_penalty = 1.25f;
  p.new_seqs.push_back(ns);
  // One that asks for prompt logprobs: the longest sampling layout.
  ns.seq_id = 13;
  ns.num_generated = 0;
  ns.sampling.prompt_logprobs = 2;
  p.new_seqs.push_back(ns);
  p.work.push_back({9, 2, 2, {}, true});
  p.work.push_back({12, 1023, 1, {6}, false});
  return p;
}

inline core::StepResult sample_result() {
  core::StepResult r;
  r.step_id = 77;
  r.outputs.push_back({9, {318, 0.0f, {}, 0}});
  r.outputs.push_back({12, {11, -0.25f, {{11, -0.25f}, {13, -2.5f}}}});
  r.outputs.push_back({14, {12, -std::numeric_limits<float>::infinity(), {}}});
  r.failures.push_back({15, "unknown sequence", true});
  r.prompt_scores.push_back({13, 1, {{2, -3.5f, {{0, -0.5f}, {9, -1.0f}}, 7}, {3, -0.75f, {}, 1}}});
  r.error = "";
  r.forward_ms = 3.25;
  r.idle_ms = 0.125;
  return r;
}

inline std::vector<Message> sample_messages() {
  std::vector<Message> all;
  Submit s;
  s.tag = 42;
  s.prompt = "Hello, \xe4\xb8\x96\xe7\x95\x8c";
  s.max_tokens = 33;
  s.temperature = 0.5f;
  s.top_k = 7;
  s.top_p = 0.75f;
  s.seed = 1ull << 63;
  s.stop = {"\n\n", "END"};
  s.logprobs = 3;
  s.ignore_eos = true;
  s.priority = -2;
  s.presence_penalty = 0.25f;
  s.frequency_penalty = -2.0f;
  s.logit_bias = {{50256, -100.0f}, {11, 3.5f}};
  s.repetition_penalty = 1.5f;
  s.prompt_logprobs = 4;
  all.push_back(s);
  Submit ids = s;
  ids.prompt.reset();
  ids.prompt_ids = std::vector<int32_t>{1, 2, 50000};
  ids.seed.reset();
  all.push_back(ids);
  all.push_back(Accepted{42, 1001});
  all.push_back(Rejected{43, RejectCode::kTooLong, "prompt of 2000 tokens is over max_model_len 1024"});
  Tokens t;
  t.tag = 42;
  t.text = " world";
  t.ids = {995, 13};
  t.logprobs = {{995, -0.5f, {{995, -0.5f}, {1, -3.0f}}}, {13, -1.5f, {}}};
  all.push_back(t);
  all.push_back(Tokens{44, "x", {87}, {}, {}, {}, {}});
  Finished f;
  f.tag = 42;
  f.finish_reason = core::FinishReason::kError;
  f.text = "!";
  f.error = "worker lost";
  f.usage = {5, 6, 16};
  f.timings = {1.5, 20.25, 300.0};
  all.push_back(f);
  all.push_back(Cancel{42});
  all.push_back(Status{});
  StatusReply sr;
  sr.workers.push_back({1, "node-a", "cpu", "ready", 10, 100, 3, 1, 250.5, 5000, 40, 12.5, 0.25});
  sr.workers.push_back({2, "node-b", "cuda:1", "draining", 0, 4096, 0, 0, 0.5});
  sr.queue_depth = 4;
  sr.max_queue = 64;
  sr.requests_served = 1234;
  sr.requests_running = 5;
  sr.requests_rejected = 6;
  sr.uptime_s = 3600.5;
  all.push_back(sr);
  Register reg;
  reg.node = "host-1:pid-99";
  reg.workers.push_back({0, "cpu", 2048, 16, 1024, 50257, 4, 0x0123456789abcdefull, 0, "", "float32"});
  reg.workers.push_back({1, "cuda:0", 100000, 32, 2048, 50257, 0, 7, 0, "", "bfloat16", "bfloat16"});
  all.push_back(reg);
  all.push_back(Registered{{{0, 10}, {1, 11}}, 500, 4});
  all.push_back(Refused{"model fingerprint differs"});
  all.push_back(Plan{1, sample_plan()});
  all.push_back(Result{1, sample_result()});
  core::StepResult failed;
  failed.step_id = 78;
  failed.error = "CUDA out of memory";
  failed.forward_ms = 1;
  all.push_back(Result{0, failed});
  all.push_back(Heartbeat{});
  all.push_back(Drain{});
  all.push_back(Shutdown{});
  all.push_back(Error{ErrorCode::kBadField, "submit.top_p: expected a number", 42});
  all.push_back(Error{ErrorCode::kUnexpected, "plan is not taken here", std::nullopt});
  // Added after the first version: optional keys, a new type, a new code.
  StatusReply faults = sr;
  faults.workers_lost = 2;
  faults.workers_hung = 1;
  faults.workers_broken = 3;
  faults.requests_moved = 40;
  faults.tokens_recomputed = 5000;
  all.push_back(faults);
  Register declared = reg;
  declared.workers[1].kv_bytes = int64_t{100000} * 32 * 73728;
  declared.workers[1].cost = R"({"knots":[1]})";
  all.push_back(declared);
  all.push_back(Plan{1, sample_plan(), 41});
  all.push_back(Heartbeat{{{0, 42, 41, 41, 0}, {1, 7, 5, 6, 12500}}, {}});
  all.push_back(Heartbeat{{}, {{0, 41}, {3, 1}}});
  all.push_back(Reset{"step 7 ran 12 s, past its deadline of 5 s"});
  all.push_back(Error{ErrorCode::kTooSlow, "you read too slowly", std::nullopt});
  Tokens prompt;  // a job's prompt and its scores (last: the indices above stay)
  prompt.tag = 45;
  prompt.prompt_ids = {15496, 11, 995};
  prompt.prompt_text = "Hello, world";
  prompt.prompt_logprobs = {{11, -2.5f, {{13, -1.0f}}, 3}, {995, -std::numeric_limits<float>::infinity(), {}, 50257}};
  all.push_back(prompt);
  return all;
}

}  // namespace troupe::transport::test
