#include "actors/router/router_core.hpp"

#include <algorithm>
#include <stdexcept>

#include "actors/router/output_text.hpp"
#include "core/splitmix.hpp"
#include "model/text/tokenizer.hpp"

namespace troupe::actors {
namespace {

double ms_between(int64_t from, int64_t to) { return static_cast<double>(to - from) / 1e6; }

}  // namespace

// A request between acceptance and its final message.
struct RouterCore::Live {
  ClientId client;
  uint64_t tag = 0;
  uint64_t id = 0;
  bool logprobs = false;
  bool ignore_eos = false;
  // prompt_logprobs: the prompt, and its scores as they come (positions 1..);
  // sent in one Tokens once complete.
  bool wants_prompt = false, prompt_sent = false;
  std::vector<int32_t> prompt_ids;
  std::vector<core::SampledToken> prompt_scores;
  int32_t prompt_tokens = 0;
  int32_t cached_tokens = 0;
  int32_t generated = 0;
  bool scheduled = false;
  int64_t accepted_at = 0, scheduled_at = 0, first_token_at = 0;
  std::unique_ptr<OutputText> text;
};

RouterCore::RouterCore(const model::Tokenizer& tokenizer, const RouterOptions& options)
    : tokenizer_(tokenizer), options_(options) {
  if (options.max_queue < 0) throw std::invalid_argument("RouterOptions: max_queue must be >= 0");
  if (options.max_model_len < 2) throw std::invalid_argument("RouterOptions: max_model_len must be >= 2");
}

RouterCore::~RouterCore() = default;

int32_t engine_prompt_logprobs(const Job& job, bool echo, int32_t prompt_logprobs) {
  int32_t k = std::max(prompt_logprobs, echo && job.logprobs >= 0 ? job.logprobs : -1);
  if (echo && job.max_tokens == 0) k = std::max(k, 0);
  return k;
}

std::variant<core::Request, Rejected> admit_job(const Job& job, const model::Tokenizer& tokenizer_,
                                                const RouterOptions& options_) {
  auto invalid = [&](const std::string& m) { return Rejected{job.tag, RejectCode::kInvalid, m}; };
  auto too_long = [&](const std::string& m) { return Rejected{job.tag, RejectCode::kTooLong, m}; };
  if (job.prompt.has_value() == job.prompt_ids.has_value()) {
    return invalid("give exactly one of prompt (text) or prompt_ids (token ids)");
  }
  core::Request r;
  if (job.prompt) {
    if (job.prompt->size() > static_cast<size_t>(options_.max_model_len) * 64) {
      return too_long("prompt of " + std::to_string(job.prompt->size()) + " bytes cannot fit " +
                      std::to_string(options_.max_model_len) + " tokens");
    }
    try {
      r.prompt_ids = tokenizer_.encode(*job.prompt);
    } catch (const std::exception& e) {
      return invalid(std::string("prompt: ") + e.what());
    }
  } else {
    r.prompt_ids = *job.prompt_ids;
    for (size_t i = 0; i < r.prompt_ids.size(); ++i) {
      const int32_t t = r.prompt_ids[i];
      if (t < 0 || t >= options_.vocab_size) {
        return invalid("prompt_ids[" + std::to_string(i) + "] = " + std::to_string(t) +
                       " is outside the vocabulary [0, " + std::to_string(options_.vocab_size) + ")");
      }
    }
  }
  const auto n = static_cast<int64_t>(r.prompt_ids.size());
  if (n == 0) return invalid("the prompt is empty");
  const bool score_only = job.max_tokens == 0 && job.prompt_logprobs >= 0;
  if (job.max_tokens < 1 && !score_only)
    return invalid("max_tokens must be >= 1 (0 only with prompt_logprobs or echo), got " +
                   std::to_string(job.max_tokens));
  if (score_only && n > options_.max_model_len) {
    return too_long("the prompt has " + std::to_string(n) + " tokens; the model takes " +
                    std::to_string(options_.max_model_len));
  }
  if (!score_only && n >= options_.max_model_len) {
    return too_long("the prompt has " + std::to_string(n) + " tokens; the model takes " +
                    std::to_string(options_.max_model_len) + " in all, so at most " +
                    std::to_string(options_.max_model_len - 1) + " leave room for one new token");
  }
  if (n + job.max_tokens > options_.max_model_len) {
    return too_long("prompt (" + std::to_string(n) + " tokens) + max_tokens (" +
                    std::to_string(job.max_tokens) + ") exceeds the model's " +
                    std::to_string(options_.max_model_len) +
                    " positions; lower max_tokens or shorten the prompt");
  }
  core::SamplingParams sampling;
  sampling.temperature = job.temperature;
  sampling.top_k = job.top_k;
  sampling.top_p = job.top_p;
  sampling.logprobs = job.logprobs;
  sampling.prompt_logprobs = job.prompt_logprobs;
  sampling.presence_penalty = job.presence_penalty;
  sampling.frequency_penalty = job.frequency_penalty;
  sampling.repetition_penalty = job.repetition_penalty;
  try {
    sampling.logit_bias = core::sorted_logit_bias(job.logit_bias);
    core::validate(sampling, options_.vocab_size);
  } catch (const std::invalid_argument& e) {
    return invalid(e.what());
  }
  if (job.stop.size() > kMaxStops) {
    return invalid("at most " + std::to_string(kMaxStops) + " stop strings, got " +
                   std::to_string(job.stop.size()));
  }
  for (const auto& s : job.stop) {
    if (s.empty()) return invalid("stop strings must be non-empty");
    if (s.size() > kMaxStopBytes)
      return invalid("a stop string is longer than " + std::to_string(kMaxStopBytes) + " bytes");
  }
  r.max_tokens = job.max_tokens;
  r.sampling = sampling;
  r.seed = job.seed;
  r.ignore_eos = job.ignore_eos;
  r.priority = job.priority;
  return r;
}

void RouterCore::on_submit(const ClientId& client, const Job& job, int64_t now, RouterOutput& out) {
  auto reject = [&](RejectCode code, const std::string& message) {
    ++stats_.rejected;
    out.replies.push_back({client, Rejected{job.tag, code, message}});
  };
  if (stats_.shutting_down) return reject(RejectCode::kShuttingDown, "the server is shutting down");
  if (by_tag_.count({client, job.tag})) {
    return reject(RejectCode::kInvalid,
                  "tag " + std::to_string(job.tag) + " is already in use by a running job");
  }
  auto checked = admit_job(job, tokenizer_, options_);
  if (auto* rej = std::get_if<Rejected>(&checked)) {
    ++stats_.rejected;
    out.replies.push_back({client, std::move(*rej)});
    return;
  }
  if (stats_.queued >= options_.max_queue) {
    return reject(RejectCode::kBusy, std::to_string(stats_.queued) +
                                         " requests are already waiting (max-queue " +
                                         std::to_string(options_.max_queue) + "); try again later");
  }
  core::Request r = std::move(std::get<core::Request>(checked));
  r.id = next_id_++;
  if (!r.seed) r.seed = core::splitmix64(options_.seed ^ core::splitmix64(seed_counter_++));
  auto live = std::make_unique<Live>();
  live->client = client;
  live->tag = job.tag;
  live->id = r.id;
  live->logprobs = job.logprobs >= 0;
  live->ignore_eos = job.ignore_eos;
  live->prompt_tokens = static_cast<int32_t>(r.prompt_ids.size());
  if (job.prompt_logprobs >= 0) {
    live->wants_prompt = true;
    live->prompt_ids = r.prompt_ids;
  }
  live->accepted_at = now;
  live->text = std::make_unique<OutputText>(tokenizer_, job.stop);
  by_tag_[{client, job.tag}] = r.id;
  by_id_.emplace(r.id, std::move(live));
  ++stats_.accepted;
  ++stats_.queued;
  out.replies.push_back({client, Accepted{job.tag, r.id}});
  out.commands.emplace_back(std::move(r));
}

void RouterCore::erase(uint64_t id) {
  auto it = by_id_.find(id);
  if (it == by_id_.end()) return;
  Live& r = *it->second;
  if (r.scheduled)
    --stats_.running;
  else
    --stats_.queued;
  by_tag_.erase({r.client, r.tag});
  by_id_.erase(it);
}

void RouterCore::finish(Live& r, const Finished& f, int64_t now, RouterOutput& out) {
  Finished msg = f;
  msg.tag = r.tag;
  msg.usage.prompt_tokens = r.prompt_tokens;
  msg.usage.completion_tokens = r.generated;
  msg.usage.cached_tokens = r.cached_tokens;
  msg.timings.queue_ms =
      r.scheduled ? ms_between(r.accepted_at, r.scheduled_at) : ms_between(r.accepted_at, now);
  msg.timings.ttft_ms = r.first_token_at ? ms_between(r.accepted_at, r.first_token_at) : 0.0;
  msg.timings.e2e_ms = ms_between(r.accepted_at, now);
  ++stats_.finished;
  stats_.prompt_tokens += r.prompt_tokens;
  out.replies.push_back({r.client, std::move(msg)});
  erase(r.id);
}

bool RouterCore::on_cancel(const ClientId& client, uint64_t tag, int64_t now, RouterOutput& out) {
  auto it = by_tag_.find({client, tag});
  if (it == by_tag_.end()) return false;
  Live& r = *by_id_.at(it->second);
  out.commands.emplace_back(FinishCommand{r.id, core::FinishReason::kCancelled});
  Finished f;
  f.finish_reason = core::FinishReason::kCancelled;
  finish(r, f, now, out);
  return true;
}

void RouterCore::on_client_gone(const ClientId& client, RouterOutput& out) {
  auto it = by_tag_.lower_bound({client, 0});
  std::vector<uint64_t> ids;
  for (; it != by_tag_.end() && it->first.first == client; ++it) ids.push_back(it->second);
  for (uint64_t id : ids) {
    out.commands.emplace_back(FinishCommand{id, core::FinishReason::kCancelled});
    ++stats_.finished;
    erase(id);
  }
}

size_t RouterCore::abort_all(const std::string& why, int64_t now, RouterOutput& out) {
  std::vector<uint64_t> ids;
  ids.reserve(by_id_.size());
  for (const auto& [id, live] : by_id_) ids.push_back(id);
  std::sort(ids.begin(), ids.end());  // in arrival order, whatever the map's
  for (uint64_t id : ids) {
    Live& r = *by_id_.at(id);
    out.commands.emplace_back(FinishCommand{id, core::FinishReason::kCancelled});
    Finished f;
    f.finish_reason = core::FinishReason::kError;
    f.error = why;
    f.text = r.text->flush();
    finish(r, f, now, out);
  }
  return ids.size();
}

void RouterCore::send_prompt_if_complete(Live& r, RouterOutput& out) {
  if (!r.wants_prompt || r.prompt_sent || r.prompt_scores.size() + 1 != r.prompt_ids.size()) return;
  Tokens d;
  d.tag = r.tag;
  d.prompt_text = tokenizer_.decode(r.prompt_ids);
  d.prompt_ids = std::move(r.prompt_ids);
  d.prompt_logprobs = std::move(r.prompt_scores);
  r.prompt_sent = true;
  out.replies.push_back({r.client, std::move(d)});
}

void RouterCore::on_events(const std::vector<core::RequestEvent>& events, int64_t now, RouterOutput& out) {
  for (const core::RequestEvent& ev : events) {
    auto it = by_id_.find(ev.request_id);
    if (it == by_id_.end()) continue;  // finished here already (stop, cancel, vanished client)
    Live& r = *it->second;
    switch (ev.kind) {
      case core::EventKind::kScheduled:
        if (!r.scheduled) {  // a moved request is scheduled again elsewhere: the first one counts
          r.scheduled = true;
          r.scheduled_at = now;
          r.cached_tokens = ev.usage.cached_tokens;
          --stats_.queued;
          ++stats_.running;
        }
        send_prompt_if_complete(r, out);  // a one-token prompt has no score to wait for
        break;
      case core::EventKind::kPromptLogprobs: {
        // Positions in order, each once (the scheduler's promise); an overlap
        // (a request moved and scored again) is skipped all the same.
        const auto have = static_cast<int32_t>(r.prompt_scores.size());
        const int32_t skip = have + 1 - ev.prompt_start;
        if (!r.wants_prompt || r.prompt_sent || skip < 0) break;
        for (size_t i = static_cast<size_t>(skip); i < ev.prompt_logprobs.size(); ++i)
          r.prompt_scores.push_back(ev.prompt_logprobs[i]);
        send_prompt_if_complete(r, out);
        break;
      }
      case core::EventKind::kToken: {
        if (!r.scheduled) {  // a token implies scheduling (events may be coalesced)
          r.scheduled = true;
          r.scheduled_at = now;
          --stats_.queued;
          ++stats_.running;
        }
        ++r.generated;
        ++stats_.output_tokens;
        if (!r.first_token_at) r.first_token_at = now;
        Tokens d;
        d.tag = r.tag;
        d.ids = {ev.token_id};
        if (r.logprobs) d.logprobs.push_back({ev.token_id, ev.logprob, ev.top_logprobs});
        const bool eos = !r.ignore_eos && ev.token_id == options_.eos_id;
        if (!eos) d.text = r.text->push(ev.token_id);
        out.replies.push_back({r.client, std::move(d)});
        if (r.text->stopped()) {
          out.commands.emplace_back(FinishCommand{r.id, core::FinishReason::kStop});
          Finished f;
          f.finish_reason = core::FinishReason::kStop;
          finish(r, f, now, out);
        }
        break;
      }
      case core::EventKind::kFinished: {
        Finished f;
        f.finish_reason = ev.finish_reason;
        f.error = ev.error;
        if (ev.finish_reason != core::FinishReason::kStop) f.text = r.text->flush();
        finish(r, f, now, out);
        break;
      }
    }
  }
}

}  // namespace troupe::actors
