// decode(): one frame body into a Message, or the reason it is not one.
//
// Two passes over the top-level map: the first records each key's value
// offset (skipping, which bounds every length and the nesting depth), the
// second reads the fields a type needs in whatever order they came. Failures
// inside are thrown as Failure (or MsgpackError for structure) and caught in
// decode(); a failure gains its key path ("work[3].new_blocks[0]") on the way
// out.
#include "transport/field_reader.hpp"
#include "transport/message_types.hpp"
#include "transport/protocol.hpp"

namespace troupe::transport {
namespace {

using namespace detail;

// [[id, x], ...] with x read by get_x: top logprobs, logit biases.
template <class GetX>
std::vector<std::pair<int32_t, float>> get_id_pairs(R& r, const char* layout, const char* x_name,
                                                    GetX get_x) {
  return get_list<std::pair<int32_t, float>>(r, [&](R& e) {
    const uint32_t n = get_tuple(e, 2, layout);
    const auto id = in("id", [&] { return get_int<int32_t>(e); });
    const auto x = in(x_name, [&] { return get_x(e); });
    skip_rest(e, n, 2);
    return std::make_pair(id, x);
  });
}

std::vector<std::pair<int32_t, float>> get_top(R& r) {
  return get_id_pairs(r, "[id, logprob]", "logprob", get_logprob);
}

std::vector<std::pair<int32_t, float>> get_bias(R& r) {
  return get_id_pairs(r, "[id, bias]", "bias", get_float);
}

// A scored prompt token: [id, logprob, rank, top].
core::SampledToken get_scored(R& e) {
  const uint32_t n = get_tuple(e, 4, "[id, logprob, rank, top]");
  core::SampledToken t;
  t.id = in("id", [&] { return get_int<int32_t>(e); });
  t.logprob = in("logprob", [&] { return get_logprob(e); });
  t.rank = in("rank", [&] { return get_int<int32_t>(e); });
  t.top = in("top", [&] { return get_top(e); });
  skip_rest(e, n, 4);
  return t;
}

core::SamplingParams get_sampling(R& r) {
  const uint32_t n = get_tuple(r, 5, "[temperature, top_k, top_p, seed, logprobs]");
  core::SamplingParams s;
  s.temperature = in("temperature", [&] { return get_float(r); });
  s.top_k = in("top_k", [&] { return get_int<int32_t>(r); });
  s.top_p = in("top_p", [&] { return get_float(r); });
  s.seed = in("seed", [&] { return get_u64(r); });
  s.logprobs = in("logprobs", [&] { return get_int<int32_t>(r); });
  if (n < 8) {
    skip_rest(r, n, 5);
    return s;
  }
  s.presence_penalty = in("presence_penalty", [&] { return get_float(r); });
  s.frequency_penalty = in("frequency_penalty", [&] { return get_float(r); });
  s.logit_bias = in("logit_bias", [&] { return get_bias(r); });
  if (n >= 9) s.repetition_penalty = in("repetition_penalty", [&] { return get_float(r); });
  if (n >= 10) s.prompt_logprobs = in("prompt_logprobs", [&] { return get_int<int32_t>(r); });
  skip_rest(r, n, std::min<uint32_t>(n, 10));
  return s;
}

core::StepPlan get_plan(R& r) {
  const uint32_t n = get_tuple(r, 4, "[step_id, drop, new_seqs, work]");
  core::StepPlan p;
  p.step_id = in("step_id", [&] { return get_u64(r); });
  p.drop = in("drop", [&] { return get_list<uint64_t>(r, get_u64); });
  p.new_seqs = in("new_seqs", [&] {
    return get_list<core::NewSequence>(r, [](R& e) {
      const uint32_t m = get_tuple(e, 5, "[seq_id, tokens, num_cached, block_table, sampling]");
      core::NewSequence ns;
      ns.seq_id = in("seq_id", [&] { return get_u64(e); });
      ns.tokens = in("tokens", [&] { return get_ints(e); });
      ns.num_cached = in("num_cached", [&] { return get_int<int32_t>(e); });
      ns.block_table = in("block_table", [&] { return get_ints(e); });
      ns.sampling = in("sampling", [&] { return get_sampling(e); });
      if (m >= 6) ns.num_generated = in("num_generated", [&] { return get_int<int32_t>(e); });
      skip_rest(e, m, m >= 6 ? 6 : 5);
      return ns;
    });
  });
  p.work = in("work", [&] {
    return get_list<core::SeqWork>(r, [](R& e) {
      const uint32_t m = get_tuple(e, 5, "[seq_id, start_pos, num_tokens, new_blocks, sample]");
      core::SeqWork w;
      w.seq_id = in("seq_id", [&] { return get_u64(e); });
      w.start_pos = in("start_pos", [&] { return get_int<int32_t>(e); });
      w.num_tokens = in("num_tokens", [&] { return get_int<int32_t>(e); });
      w.new_blocks = in("new_blocks", [&] { return get_ints(e); });
      w.sample = in("sample", [&] { return get_bool(e); });
      skip_rest(e, m, 5);
      return w;
    });
  });
  skip_rest(r, n, 4);
  return p;
}

core::StepResult get_result(R& r) {
  const uint32_t n = get_tuple(r, 6, "[step_id, outputs, failures, error, forward_ms, idle_ms]");
  core::StepResult res;
  res.step_id = in("step_id", [&] { return get_u64(r); });
  res.outputs = in("outputs", [&] {
    return get_list<core::SeqOutput>(r, [](R& e) {
      const uint32_t m = get_tuple(e, 2, "[seq_id, id] or [seq_id, id, logprob, top]");
      if (m == 3) bad("expected [seq_id, id] or [seq_id, id, logprob, top], got 3 elements");
      core::SeqOutput o;
      o.seq_id = in("seq_id", [&] { return get_u64(e); });
      o.token.id = in("id", [&] { return get_int<int32_t>(e); });
      if (m >= 4) {
        o.token.logprob = in("logprob", [&] { return get_logprob(e); });
        o.token.top = in("top", [&] { return get_top(e); });
      }
      skip_rest(e, m, m >= 4 ? 4 : 2);
      return o;
    });
  });
  res.failures = in("failures", [&] {
    return get_list<core::SeqFailure>(r, [](R& e) {
      const uint32_t m = get_tuple(e, 3, "[seq_id, error, retryable]");
      core::SeqFailure f;
      f.seq_id = in("seq_id", [&] { return get_u64(e); });
      f.error = in("error", [&] { return get_str(e); });
      f.retryable = in("retryable", [&] { return get_bool(e); });
      skip_rest(e, m, 3);
      return f;
    });
  });
  res.error = in("error", [&] { return get_str(r); });
  res.forward_ms = in("forward_ms", [&] { return get_double(r); });
  res.idle_ms = in("idle_ms", [&] { return get_double(r); });
  if (n >= 7) {
    res.prompt_scores = in("prompt_scores", [&] {
      return get_list<core::PromptScores>(r, [](R& e) {
        const uint32_t m = get_tuple(e, 3, "[seq_id, start, tokens]");
        core::PromptScores p;
        p.seq_id = in("seq_id", [&] { return get_u64(e); });
        p.start = in("start", [&] { return get_int<int32_t>(e); });
        p.tokens = in("tokens", [&] { return get_list<core::SampledToken>(e, get_scored); });
        skip_rest(e, m, 3);
        return p;
      });
    });
  }
  skip_rest(r, n, std::min<uint32_t>(n, 7));
  return res;
}

using core::FinishReason;
constexpr std::array<FinishReason, 5> kFinishReasons = {FinishReason::kEos, FinishReason::kLength,
                                                        FinishReason::kStop, FinishReason::kCancelled,
                                                        FinishReason::kError};
constexpr std::array<RejectCode, 5> kRejectCodes = {RejectCode::kBusy, RejectCode::kInvalid,
                                                    RejectCode::kTooLong, RejectCode::kNoWorkers,
                                                    RejectCode::kShuttingDown};
constexpr std::array<ErrorCode, 7> kErrorCodes = {
    ErrorCode::kMalformed, ErrorCode::kBadVersion, ErrorCode::kUnknownType, ErrorCode::kBadField,
    ErrorCode::kTooLarge,  ErrorCode::kUnexpected, ErrorCode::kTooSlow};

// An array header of at most `max` elements (0 = any), checked before any
// element is read: a frame cannot make the reader walk past a bound.
uint32_t get_array_at_most(R& r, size_t max, const char* what) {
  const uint32_t n = get_array(r);
  if (max != 0 && n > max) bad("at most " + std::to_string(max) + " " + what + ", got " + std::to_string(n));
  return n;
}

// A string of at most `max` bytes (0 = any), checked before it is copied.
std::string get_str_at_most(R& r, size_t max, const char* what) {
  std::string_view s;
  if (!r.read_str(s)) bad("expected a string" + got(r));
  if (max != 0 && s.size() > max)
    bad(std::string(what) + " of " + std::to_string(s.size()) + " bytes; at most " + std::to_string(max));
  return std::string(s);
}

Submit get_submit(const Fields& f, const SubmitLimits& limits) {
  Submit m;
  m.tag = f.req("tag", get_u64);
  if (f.has("prompt") == f.has("prompt_ids"))
    throw Failure{ErrorCode::kBadField, "prompt",
                  "give exactly one of \"prompt\" (text) or \"prompt_ids\" (token ids)"};
  f.opt("prompt", m.prompt, [&](R& r) { return get_str_at_most(r, limits.max_prompt_bytes, "a prompt"); });
  f.opt("prompt_ids", m.prompt_ids, [&](R& r) {
    R head = r;
    get_array_at_most(head, limits.max_prompt_ids, "prompt ids (the model's positions)");
    return get_ints(r);
  });
  f.opt("max_tokens", m.max_tokens, get_int<int32_t>);
  f.opt("temperature", m.temperature, get_float);
  f.opt("top_k", m.top_k, get_int<int32_t>);
  f.opt("top_p", m.top_p, get_float);
  f.opt("seed", m.seed, get_u64);
  f.opt("stop", m.stop, [&](R& r) {
    R head = r;
    get_array_at_most(head, limits.max_stops, "stop strings");
    return get_list<std::string>(
        r, [&](R& e) { return get_str_at_most(e, limits.max_stop_bytes, "a stop string"); });
  });
  f.opt("logprobs", m.logprobs, get_int<int32_t>);
  f.opt("ignore_eos", m.ignore_eos, get_bool);
  f.opt("priority", m.priority, get_int<int32_t>);
  f.opt("presence_penalty", m.presence_penalty, get_float);
  f.opt("frequency_penalty", m.frequency_penalty, get_float);
  f.opt("logit_bias", m.logit_bias, [&](R& r) {
    R head = r;
    get_array_at_most(head, limits.max_logit_bias, "logit_bias entries");
    return get_bias(r);
  });
  f.opt("repetition_penalty", m.repetition_penalty, get_float);
  f.opt("prompt_logprobs", m.prompt_logprobs, get_int<int32_t>);
  return m;
}

Tokens get_tokens(const Fields& f) {
  Tokens m;
  m.tag = f.req("tag", get_u64);
  m.text = f.req("text", get_str);
  m.ids = f.req("ids", get_ints);
  f.opt("logprobs", m.logprobs, [&](R& r) {
    auto list = get_list<core::SampledToken>(r, [](R& e) {
      const uint32_t n = get_tuple(e, 2, "[logprob, top]");
      core::SampledToken t;
      t.logprob = in("logprob", [&] { return get_logprob(e); });
      t.top = in("top", [&] { return get_top(e); });
      skip_rest(e, n, 2);
      return t;
    });
    if (list.size() != m.ids.size())
      bad("has " + std::to_string(list.size()) + " entries for " + std::to_string(m.ids.size()) + " ids");
    for (size_t i = 0; i < list.size(); ++i) list[i].id = m.ids[i];
    return list;
  });
  f.opt("prompt_ids", m.prompt_ids, get_ints);
  f.opt("prompt_logprobs", m.prompt_logprobs, [&](R& r) {
    auto list = get_list<core::SampledToken>(r, [](R& e) {
      const uint32_t n = get_tuple(e, 3, "[logprob, rank, top]");
      core::SampledToken t;
      t.logprob = in("logprob", [&] { return get_logprob(e); });
      t.rank = in("rank", [&] { return get_int<int32_t>(e); });
      t.top = in("top", [&] { return get_top(e); });
      skip_rest(e, n, 3);
      return t;
    });
    if (m.prompt_ids.empty() || list.size() != m.prompt_ids.size() - 1)
      bad("has " + std::to_string(list.size()) + " entries for " + std::to_string(m.prompt_ids.size()) +
          " prompt ids (one per prompt id after the first)");
    for (size_t i = 0; i < list.size(); ++i) list[i].id = m.prompt_ids[i + 1];
    return list;
  });
  if (!m.prompt_ids.empty() && !f.has("prompt_logprobs")) bad("prompt_ids without prompt_logprobs");
  f.opt("prompt_text", m.prompt_text, get_str);
  return m;
}

Finished get_finished(const Fields& f) {
  Finished m;
  m.tag = f.req("tag", get_u64);
  m.finish_reason = f.req("finish_reason", [](R& r) { return get_enum(r, kFinishReasons); });
  m.text = f.req("text", get_str);
  f.opt("error", m.error, get_str);
  m.usage = f.req("usage", [](R& r) {
    Fields u(r);
    core::Usage usage;
    usage.prompt_tokens = u.req("prompt_tokens", get_int<int32_t>);
    usage.completion_tokens = u.req("completion_tokens", get_int<int32_t>);
    usage.cached_tokens = u.req("cached_tokens", get_int<int32_t>);
    return usage;
  });
  m.timings = f.req("timings", [](R& r) {
    Fields t(r);
    Timings timings;
    timings.queue_ms = t.req("queue_ms", get_double);
    timings.ttft_ms = t.req("ttft_ms", get_double);
    timings.e2e_ms = t.req("e2e_ms", get_double);
    return timings;
  });
  return m;
}

StatusReply get_status_reply(const Fields& f) {
  StatusReply m;
  m.workers = f.req("workers", [](R& r) {
    return get_list<WorkerStatus>(r, [](R& e) {
      Fields w(e);
      WorkerStatus s;
      s.id = w.req("id", get_int<uint32_t>);
      s.node = w.req("node", get_str);
      s.device = w.req("device", get_str);
      s.state = w.req("state", get_str);
      s.kv_used = w.req("kv_used", get_int<int32_t>);
      s.kv_total = w.req("kv_total", get_int<int32_t>);
      s.running = w.req("running", get_int<int32_t>);
      s.waiting = w.req("waiting", get_int<int32_t>);
      s.tokens_per_s = w.req("tokens_per_s", get_double);
      w.opt("tokens", s.tokens, get_u64);
      w.opt("steps", s.steps, get_u64);
      w.opt("busy_s", s.busy_s, get_double);
      w.opt("idle_s", s.idle_s, get_double);
      return s;
    });
  });
  m.queue_depth = f.req("queue_depth", get_i64);
  m.max_queue = f.req("max_queue", get_i64);
  m.requests_served = f.req("requests_served", get_u64);
  m.requests_running = f.req("requests_running", get_u64);
  m.requests_rejected = f.req("requests_rejected", get_u64);
  m.uptime_s = f.req("uptime_s", get_double);
  f.opt("workers_lost", m.workers_lost, get_u64);
  f.opt("workers_hung", m.workers_hung, get_u64);
  f.opt("workers_broken", m.workers_broken, get_u64);
  f.opt("requests_moved", m.requests_moved, get_u64);
  f.opt("tokens_recomputed", m.tokens_recomputed, get_u64);
  return m;
}

Heartbeat get_heartbeat(const Fields& f) {
  Heartbeat m;
  f.opt("progress", m.progress, [](R& r) {
    return get_list<WorkerProgress>(r, [](R& e) {
      const uint32_t n = get_tuple(e, 5, "[index, plans_received, results_sent, steps_done, running_ms]");
      WorkerProgress p;
      p.index = in("index", [&] { return get_int<uint32_t>(e); });
      p.plans_received = in("plans_received", [&] { return get_u64(e); });
      p.results_sent = in("results_sent", [&] { return get_u64(e); });
      p.steps_done = in("steps_done", [&] { return get_u64(e); });
      p.running_ms = in("running_ms", [&] { return get_i64(e); });
      skip_rest(e, n, 5);
      return p;
    });
  });
  f.opt("acks", m.acks, [](R& r) {
    return get_list<WorkerAck>(r, [](R& e) {
      const uint32_t n = get_tuple(e, 2, "[index, results_received]");
      WorkerAck a;
      a.index = in("index", [&] { return get_int<uint32_t>(e); });
      a.results_received = in("results_received", [&] { return get_u64(e); });
      skip_rest(e, n, 2);
      return a;
    });
  });
  return m;
}

Register get_register(const Fields& f) {
  Register m;
  m.node = f.req("node", get_str);
  m.workers = f.req("workers", [](R& r) {
    return get_list<WorkerInfo>(r, [](R& e) {
      Fields w(e);
      WorkerInfo i;
      i.index = w.req("index", get_int<uint32_t>);
      i.device = w.req("device", get_str);
      i.num_blocks = w.req("num_blocks", get_int<int32_t>);
      i.block_size = w.req("block_size", get_int<int32_t>);
      i.max_model_len = w.req("max_model_len", get_int<int32_t>);
      i.vocab_size = w.req("vocab_size", get_int<int32_t>);
      i.threads = w.req("threads", get_int<int32_t>);
      i.fingerprint = w.req("fingerprint", get_u64);
      w.opt("kv_bytes", i.kv_bytes, get_int<int64_t>);
      w.opt("cost", i.cost, get_str);
      w.opt("dtype", i.dtype, get_str);
      w.opt("kv_dtype", i.kv_dtype, get_str);
      return i;
    });
  });
  return m;
}

Registered get_registered(const Fields& f) {
  Registered m;
  m.workers = f.req("workers", [](R& r) {
    return get_list<WorkerId>(r, [](R& e) {
      Fields w(e);
      WorkerId id;
      id.index = w.req("index", get_int<uint32_t>);
      id.worker_id = w.req("worker_id", get_int<uint32_t>);
      return id;
    });
  });
  m.heartbeat_ms = f.req("heartbeat_ms", get_int<int32_t>);
  m.liveness = f.req("liveness", get_int<int32_t>);
  return m;
}

// `type` is the frame's "t"; throws kUnknownType for a name no message has.
Message decode_message(const std::string& type, const Fields& f, const SubmitLimits& limits) {
  size_t index = kMessageTypes.size();
  for (size_t i = 0; i < kMessageTypes.size(); ++i)
    if (type == kMessageTypes[i]) index = i;
  switch (index) {
    case 0:
      return get_submit(f, limits);
    case 1:
      return Accepted{f.req("tag", get_u64), f.req("request_id", get_u64)};
    case 2:
      return Rejected{f.req("tag", get_u64), f.req("code", [](R& r) { return get_enum(r, kRejectCodes); }),
                      f.req("message", get_str)};
    case 3:
      return get_tokens(f);
    case 4:
      return get_finished(f);
    case 5:
      return Cancel{f.req("tag", get_u64)};
    case 6:
      return Status{};
    case 7:
      return get_status_reply(f);
    case 8:
      return get_register(f);
    case 9:
      return get_registered(f);
    case 10:
      return Refused{f.req("reason", get_str)};
    case 11: {
      Plan p{f.req("worker", get_int<uint32_t>), f.req("plan", get_plan), 0};
      f.opt("ack", p.ack, get_u64);
      return p;
    }
    case 12:
      return Result{f.req("worker", get_int<uint32_t>), f.req("result", get_result)};
    case 13:
      return get_heartbeat(f);
    case 14:
      return Drain{};
    case 15:
      return Shutdown{};
    case 16: {
      Error e{f.req("code", [](R& r) { return get_enum(r, kErrorCodes); }), f.req("message", get_str),
              std::nullopt};
      f.opt("tag", e.tag, get_u64);
      return e;
    }
    case 17:
      return Reset{f.req("reason", get_str)};
  }
  throw Failure{ErrorCode::kUnknownType, "", "unknown message type \"" + printable(type) + "\""};
}

}  // namespace

Decoded decode(std::string_view bytes, size_t max_frame_bytes, const SubmitLimits& limits) {
  Decoded d;
  if (bytes.size() > max_frame_bytes) {
    d.error = {ErrorCode::kTooLarge,
               "frame of " + std::to_string(bytes.size()) + " bytes is over the limit of " +
                   std::to_string(max_frame_bytes) + " bytes",
               "", std::nullopt};
    return d;
  }
  std::string type;
  std::optional<uint64_t> tag;
  try {
    R r(bytes);
    Fields f(r, /*top_level=*/true);
    if (!r.at_end()) malformed(std::to_string(r.remaining()) + " bytes follow the frame's map");
    std::string_view sv;
    auto p = f.find("p");
    if (!p || !p->read_str(sv) || sv != kProtocolName)
      malformed("not a troupe frame (key \"p\" must be \"troupe\")");
    if (auto t = f.find("t"); t && t->read_str(sv)) type = printable(sv);
    if (auto g = f.find("tag")) {
      uint64_t v = 0;
      if (g->read_uint(v)) tag = v;
    }
    const int64_t version = f.req("v", get_int<int64_t>);
    if (version != kProtocolVersion)
      throw Failure{ErrorCode::kBadVersion, "",
                    "protocol version " + std::to_string(version) +
                        " is not supported (this peer speaks version " + std::to_string(kProtocolVersion) +
                        ")"};
    const std::string t = f.req("t", get_str);
    d.message = decode_message(t, f, limits);
  } catch (Failure& e) {
    std::string where = e.path;  // unknown_type: the problem names the type already
    if (!type.empty() && e.code != ErrorCode::kUnknownType) where = where.empty() ? type : type + "." + where;
    d.error = {e.code, where.empty() ? e.problem : where + ": " + e.problem, type, tag};
  } catch (const MsgpackError& e) {
    d.error = {ErrorCode::kMalformed, e.what(), type, tag};
  } catch (const std::exception& e) {  // std::bad_alloc: the frame's contents, not its claims, were too big
    d.error = {ErrorCode::kMalformed, std::string("unreadable frame: ") + e.what(), type, tag};
  }
  return d;
}

}  // namespace troupe::transport
