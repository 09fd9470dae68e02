// encode(): every message as one msgpack map (msgpack-c's packer picks the
// shortest encoding of each integer, so small ids and positions take 1 byte).
#include <msgpack/pack.hpp>

#include "transport/protocol.hpp"

namespace troupe::transport {
namespace {

struct StringSink {
  std::string* out;
  void write(const char* data, size_t size) { out->append(data, size); }
};

class Writer {
 public:
  explicit Writer(std::string& out) : sink_{&out}, pk_(sink_) {}

  // The map header and the three keys every frame has; `fields` more follow.
  void begin(const char* type, size_t fields) {
    map(3 + fields);
    kv("p", kProtocolName);
    kv("v", int32_t{kProtocolVersion});
    kv("t", type);
  }
  void array(size_t n) { pk_.pack_array(static_cast<uint32_t>(n)); }
  void map(size_t n) { pk_.pack_map(static_cast<uint32_t>(n)); }

  // One value, in the msgpack kind its C++ type maps to.
  void value(std::string_view s) {
    pk_.pack_str(static_cast<uint32_t>(s.size()));
    pk_.pack_str_body(s.data(), static_cast<uint32_t>(s.size()));
  }
  void value(const std::string& s) { value(std::string_view(s)); }
  void value(const char* s) { value(std::string_view(s)); }
  void value(uint64_t v) { pk_.pack_uint64(v); }
  void value(uint32_t v) { pk_.pack_uint64(v); }
  void value(int64_t v) { pk_.pack_int64(v); }
  void value(int32_t v) { pk_.pack_int64(v); }
  void value(float v) { pk_.pack_float(v); }
  void value(double v) { pk_.pack_double(v); }
  void value(bool v) { v ? pk_.pack_true() : pk_.pack_false(); }
  template <class T>
  void value(const std::vector<T>& items) {
    array(items.size());
    for (const auto& x : items) value(x);
  }
  template <class A, class B>
  void value(const std::pair<A, B>& p) {
    tuple(p.first, p.second);
  }

  // A key and its value.
  template <class T>
  void kv(std::string_view key, const T& v) {
    value(key);
    value(v);
  }
  // A compact record: [a, b, ...].
  template <class... T>
  void tuple(const T&... items) {
    array(sizeof...(items));
    (value(items), ...);
  }

 private:
  StringSink sink_;
  msgpack::packer<StringSink> pk_;
};

// [temperature, top_k, top_p, seed, logprobs], and only when they adjust the
// logits or ask for prompt logprobs, presence_penalty, frequency_penalty,
// logit_bias ([[id, bias], ...]), repetition_penalty, and then only with
// prompt logprobs, prompt_logprobs.
void write_sampling(Writer& w, const core::SamplingParams& s) {
  if (s.prompt_logprobs >= 0)
    return w.tuple(s.temperature, s.top_k, s.top_p, s.seed, s.logprobs, s.presence_penalty, s.frequency_penalty,
                   s.logit_bias, s.repetition_penalty, s.prompt_logprobs);
  if (!s.adjusts_logits()) return w.tuple(s.temperature, s.top_k, s.top_p, s.seed, s.logprobs);
  w.tuple(s.temperature, s.top_k, s.top_p, s.seed, s.logprobs, s.presence_penalty, s.frequency_penalty,
          s.logit_bias, s.repetition_penalty);
}

// [step_id, drop, new_seqs, work]; new sequence: [seq_id, tokens, num_cached,
// block_table, sampling] and, for a resumed one, num_generated; work:
// [seq_id, start_pos, num_tokens, new_blocks, sample].
void write_plan(Writer& w, const core::StepPlan& p) {
  w.array(4);
  w.value(p.step_id);
  w.value(p.drop);
  w.array(p.new_seqs.size());
  for (const auto& ns : p.new_seqs) {
    w.array(ns.num_generated > 0 ? 6 : 5);
    w.value(ns.seq_id);
    w.value(ns.tokens);
    w.value(ns.num_cached);
    w.value(ns.block_table);
    write_sampling(w, ns.sampling);
    if (ns.num_generated > 0) w.value(ns.num_generated);
  }
  w.array(p.work.size());
  for (const auto& sw : p.work) w.tuple(sw.seq_id, sw.start_pos, sw.num_tokens, sw.new_blocks, sw.sample);
}

// [step_id, outputs, failures, error, forward_ms, idle_ms] and, when prompt
// tokens were scored, prompt_scores; output: [seq_id, id] or, with logprobs,
// [seq_id, id, logprob, top]; failure: [seq_id, error, retryable]; prompt
// scores: [seq_id, start, [[id, logprob, rank, top], ...]].
void write_result(Writer& w, const core::StepResult& r) {
  w.array(r.prompt_scores.empty() ? 6 : 7);
  w.value(r.step_id);
  w.array(r.outputs.size());
  for (const auto& o : r.outputs) {
    if (o.token.logprob != 0.0f || !o.token.top.empty())
      w.tuple(o.seq_id, o.token.id, o.token.logprob, o.token.top);
    else
      w.tuple(o.seq_id, o.token.id);
  }
  w.array(r.failures.size());
  for (const auto& f : r.failures) w.tuple(f.seq_id, f.error, f.retryable);
  w.value(r.error);
  w.value(r.forward_ms);
  w.value(r.idle_ms);
  if (r.prompt_scores.empty()) return;
  w.array(r.prompt_scores.size());
  for (const auto& p : r.prompt_scores) {
    w.array(3);
    w.value(p.seq_id);
    w.value(p.start);
    w.array(p.tokens.size());
    for (const auto& t : p.tokens) w.tuple(t.id, t.logprob, t.rank, t.top);
  }
}

struct Encoder {
  Writer& w;

  void operator()(const Submit& m) {
    const bool presence = m.presence_penalty != 0.0f, frequency = m.frequency_penalty != 0.0f,
               bias = !m.logit_bias.empty(), repetition = m.repetition_penalty != 1.0f;
    const bool prompt_logprobs = m.prompt_logprobs >= 0;
    w.begin("submit", 10 + (m.seed ? 1 : 0) + (presence ? 1 : 0) + (frequency ? 1 : 0) + (bias ? 1 : 0) +
                          (repetition ? 1 : 0) + (prompt_logprobs ? 1 : 0));
    w.kv("tag", m.tag);
    if (m.prompt_ids)
      w.kv("prompt_ids", *m.prompt_ids);
    else
      w.kv("prompt", m.prompt ? *m.prompt : std::string());
    w.kv("max_tokens", m.max_tokens);
    w.kv("temperature", m.temperature);
    w.kv("top_k", m.top_k);
    w.kv("top_p", m.top_p);
    if (m.seed) w.kv("seed", *m.seed);
    w.kv("stop", m.stop);
    w.kv("logprobs", m.logprobs);
    w.kv("ignore_eos", m.ignore_eos);
    w.kv("priority", m.priority);
    if (presence) w.kv("presence_penalty", m.presence_penalty);
    if (frequency) w.kv("frequency_penalty", m.frequency_penalty);
    if (bias) w.kv("logit_bias", m.logit_bias);
    if (repetition) w.kv("repetition_penalty", m.repetition_penalty);
    if (prompt_logprobs) w.kv("prompt_logprobs", m.prompt_logprobs);
  }
  void operator()(const Accepted& m) {
    w.begin("accepted", 2);
    w.kv("tag", m.tag);
    w.kv("request_id", m.request_id);
  }
  void operator()(const Rejected& m) {
    w.begin("rejected", 3);
    w.kv("tag", m.tag);
    w.kv("code", to_string(m.code));
    w.kv("message", m.message);
  }
  void operator()(const Tokens& m) {
    const bool prompt = !m.prompt_ids.empty();
    w.begin("tokens", (m.logprobs.empty() ? 3 : 4) + (prompt ? 3 : 0));
    w.kv("tag", m.tag);
    w.kv("text", m.text);
    w.kv("ids", m.ids);
    if (!m.logprobs.empty()) {
      w.value("logprobs");  // [[logprob, top], ...], one per id
      w.array(m.logprobs.size());
      for (const auto& t : m.logprobs) w.tuple(t.logprob, t.top);
    }
    if (prompt) {
      w.kv("prompt_ids", m.prompt_ids);
      w.value("prompt_logprobs");  // [[logprob, rank, top], ...], one per prompt_ids[1..]
      w.array(m.prompt_logprobs.size());
      for (const auto& t : m.prompt_logprobs) w.tuple(t.logprob, t.rank, t.top);
      w.kv("prompt_text", m.prompt_text);
    }
  }
  void operator()(const Finished& m) {
    w.begin("finished", m.error.empty() ? 5 : 6);
    w.kv("tag", m.tag);
    w.kv("finish_reason", core::to_string(m.finish_reason));
    w.kv("text", m.text);
    if (!m.error.empty()) w.kv("error", m.error);
    w.value("usage");
    w.map(3);
    w.kv("prompt_tokens", m.usage.prompt_tokens);
    w.kv("completion_tokens", m.usage.completion_tokens);
    w.kv("cached_tokens", m.usage.cached_tokens);
    w.value("timings");
    w.map(3);
    w.kv("queue_ms", m.timings.queue_ms);
    w.kv("ttft_ms", m.timings.ttft_ms);
    w.kv("e2e_ms", m.timings.e2e_ms);
  }
  void operator()(const Cancel& m) {
    w.begin("cancel", 1);
    w.kv("tag", m.tag);
  }
  void operator()(const Status&) { w.begin("status", 0); }
  void operator()(const StatusReply& m) {
    w.begin("status_reply", 12);
    w.value("workers");
    w.array(m.workers.size());
    for (const auto& s : m.workers) {
      w.map(13);
      w.kv("id", s.id);
      w.kv("node", s.node);
      w.kv("device", s.device);
      w.kv("state", s.state);
      w.kv("kv_used", s.kv_used);
      w.kv("kv_total", s.kv_total);
      w.kv("running", s.running);
      w.kv("waiting", s.waiting);
      w.kv("tokens_per_s", s.tokens_per_s);
      w.kv("tokens", s.tokens);
      w.kv("steps", s.steps);
      w.kv("busy_s", s.busy_s);
      w.kv("idle_s", s.idle_s);
    }
    w.kv("queue_depth", m.queue_depth);
    w.kv("max_queue", m.max_queue);
    w.kv("workers_lost", m.workers_lost);
    w.kv("workers_hung", m.workers_hung);
    w.kv("workers_broken", m.workers_broken);
    w.kv("requests_moved", m.requests_moved);
    w.kv("tokens_recomputed", m.tokens_recomputed);
    w.kv("requests_served", m.requests_served);
    w.kv("requests_running", m.requests_running);
    w.kv("requests_rejected", m.requests_rejected);
    w.kv("uptime_s", m.uptime_s);
  }
  void operator()(const Register& m) {
    w.begin("register", 2);
    w.kv("node", m.node);
    w.value("workers");
    w.array(m.workers.size());
    for (const auto& i : m.workers) {
      const bool dtype = i.dtype != "float32";  // absent: float32, what a node before --dtype ran
      const bool kv_dtype = i.kv_dtype != "float32";  // the same for --kv-cache-dtype
      w.map(8 + (i.kv_bytes != 0) + !i.cost.empty() + dtype + kv_dtype);
      w.kv("index", i.index);
      w.kv("device", i.device);
      w.kv("num_blocks", i.num_blocks);
      w.kv("block_size", i.block_size);
      w.kv("max_model_len", i.max_model_len);
      w.kv("vocab_size", i.vocab_size);
      w.kv("threads", i.threads);
      w.kv("fingerprint", i.fingerprint);
      if (i.kv_bytes != 0) w.kv("kv_bytes", i.kv_bytes);
      if (!i.cost.empty()) w.kv("cost", i.cost);
      if (dtype) w.kv("dtype", i.dtype);
      if (kv_dtype) w.kv("kv_dtype", i.kv_dtype);
    }
  }
  void operator()(const Registered& m) {
    w.begin("registered", 3);
    w.value("workers");
    w.array(m.workers.size());
    for (const auto& id : m.workers) {
      w.map(2);
      w.kv("index", id.index);
      w.kv("worker_id", id.worker_id);
    }
    w.kv("heartbeat_ms", m.heartbeat_ms);
    w.kv("liveness", m.liveness);
  }
  void operator()(const Refused& m) {
    w.begin("refused", 1);
    w.kv("reason", m.reason);
  }
  void operator()(const Plan& m) {
    w.begin("plan", m.ack ? 3 : 2);
    w.kv("worker", m.worker);
    w.value("plan");
    write_plan(w, m.plan);
    if (m.ack) w.kv("ack", m.ack);
  }
  void operator()(const Result& m) {
    w.begin("result", 2);
    w.kv("worker", m.worker);
    w.value("result");
    write_result(w, m.result);
  }
  void operator()(const Heartbeat& m) {
    w.begin("heartbeat", !m.progress.empty() + !m.acks.empty());
    if (!m.progress.empty()) {
      w.value("progress");  // [[index, plans_received, results_sent, steps_done, running_ms], ...]
      w.array(m.progress.size());
      for (const auto& p : m.progress)
        w.tuple(p.index, p.plans_received, p.results_sent, p.steps_done, p.running_ms);
    }
    if (!m.acks.empty()) {
      w.value("acks");  // [[index, results_received], ...]
      w.array(m.acks.size());
      for (const auto& a : m.acks) w.tuple(a.index, a.results_received);
    }
  }
  void operator()(const Drain&) { w.begin("drain", 0); }
  void operator()(const Shutdown&) { w.begin("shutdown", 0); }
  void operator()(const Reset& m) {
    w.begin("reset", 1);
    w.kv("reason", m.reason);
  }
  void operator()(const Error& m) {
    w.begin("error", m.tag ? 3 : 2);
    w.kv("code", to_string(m.code));
    w.kv("message", m.message);
    if (m.tag) w.kv("tag", *m.tag);
  }
};

}  // namespace

std::string encode(const Message& message) {
  std::string out;
  Writer w(out);
  std::visit(Encoder{w}, message);
  return out;
}

}  // namespace troupe::transport
