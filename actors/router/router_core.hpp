#pragma once
// RouterCore: the pure core of the router actor, the cluster's front door.
// It validates and tokenizes jobs, assigns request ids and seeds (so a
// request's output never depends on the worker that serves it), bounds the
// queue (past `max_queue` requests waiting to start, a job gets an explicit
// `busy` at once), and turns the batcher's token events into each client's
// stream: incremental detokenising and stop strings happen here, off the
// batcher's critical path (vLLM v1's output processor); a stop found here
// ends the sequence at the batcher.
//
//   client ──Submit──▶ RouterCore ──Request / FinishCommand──▶ batcher
//   client ◀──Accepted, Rejected, Tokens, Finished── RouterCore ◀──RequestEvents── batcher
//
// A request's life here: accepted (queued) → scheduled → streaming → done.
// Cancel, a vanished client, a stop string, eos, length and errors all end
// it exactly once. No threads, clocks or I/O: time comes in as `now` (ns).
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <variant>
#include <vector>

#include "actors/router/client_id.hpp"
#include "core/batcher.hpp"
#include "core/request.hpp"
#include "core/sampling_params.hpp"
#include "transport/protocol.hpp"

namespace troupe::model {
class Tokenizer;
}

namespace troupe::actors {

class OutputText;

// A job is what a client submits (transport::Submit); the client messages
// are the wire's (transport/protocol.hpp), so every front speaks them.
using Job = transport::Submit;
using transport::Accepted;
using transport::Finished;
using transport::RejectCode;
using transport::Rejected;
using transport::Timings;
using transport::Tokens;

struct RouterOptions {
  int32_t max_queue = 1024;      // accepted requests not yet started, at most; >= 0
  int32_t max_model_len = 1024;  // prompt + max_tokens at most (the model's n_positions)
  int32_t vocab_size = 50257;
  int32_t eos_id = 50256;  // -1 = none
  uint64_t seed = 0;       // base of the seeds drawn for jobs that bring none
};

constexpr size_t kMaxStops = 16;        // stop strings per job
constexpr size_t kMaxStopBytes = 1024;  // bytes per stop string

struct RouterStats {
  int64_t accepted = 0;
  int64_t rejected = 0;
  int64_t finished = 0;       // requests ended (any reason)
  int32_t queued = 0;         // accepted, not yet started
  int32_t running = 0;        // started, not finished
  int64_t prompt_tokens = 0;  // of finished requests
  int64_t output_tokens = 0;  // streamed
  int32_t workers = 0;        // as last told by the batcher
  bool shutting_down = false;
};

// The batcher's view (the answer to its stats request).
struct BatcherStatus {
  std::vector<core::WorkerStats> workers;
  int32_t waiting = 0;  // requests queued (placed or not), not running
  int32_t running = 0;
  int32_t unplaced = 0;  // waiting for any worker
  core::BatcherCounters counters;
  bool answered = false;  // false: the batcher did not answer (the rest is empty)
};

// What `troupe status` shows.
struct StatusReport {
  BatcherStatus batcher;
  RouterStats router;
  double uptime_s = 0;
};

using ClientMessage = std::variant<Accepted, Rejected, Tokens, Finished, StatusReport>;

struct Reply {
  ClientId client;
  ClientMessage message;
};

// What the batcher must do: run a request, or end one (cancel, stop).
struct FinishCommand {
  uint64_t request_id = 0;
  core::FinishReason reason = core::FinishReason::kCancelled;
};
using BatcherCommand = std::variant<core::Request, FinishCommand>;

struct RouterOutput {
  std::vector<Reply> replies;
  std::vector<BatcherCommand> commands;
};

// Checks and tokenizes a job: the request to run (id unset; seed as the job
// gave it), or why not. The one validation of a job, for every front and
// for `troupe batch`.
// The prompt_logprobs a front's job asks the engine for, given OpenAI's
// `echo` and vLLM's `prompt_logprobs` (-1 = not asked): those, echo's
// `logprobs` when it has them, and at least 0 for an echo that generates
// nothing (the prompt is its whole answer). An echo without logprobs that
// generates needs no scores: the front shows the prompt's text itself.
int32_t engine_prompt_logprobs(const Job& job, bool echo, int32_t prompt_logprobs);

std::variant<core::Request, Rejected> admit_job(const Job& job, const model::Tokenizer& tokenizer,
                                                const RouterOptions& options);

class RouterCore {
 public:
  // `tokenizer` must outlive the router.
  RouterCore(const model::Tokenizer& tokenizer, const RouterOptions& options);
  ~RouterCore();
  RouterCore(const RouterCore&) = delete;
  RouterCore& operator=(const RouterCore&) = delete;

  void on_submit(const ClientId& client, const Job& job, int64_t now, RouterOutput& out);
  // The client gives up a job; false when it is not (or no longer) running.
  bool on_cancel(const ClientId& client, uint64_t tag, int64_t now, RouterOutput& out);
  // The client cannot be reached any more: its requests are cancelled (their
  // KV freed) and nothing more is sent to it.
  void on_client_gone(const ClientId& client, RouterOutput& out);
  void on_events(const std::vector<core::RequestEvent>& events, int64_t now, RouterOutput& out);
  // How many workers the batcher has (0: new jobs wait for one, up to its deadline).
  void set_workers(int32_t n) { stats_.workers = n; }
  // New jobs are refused from now on ("shutting_down"); running ones go on.
  void begin_shutdown() { stats_.shutting_down = true; }
  // Ends every job still open with finish reason `error` and `why` (the
  // server stops before they finish): each client gets its Finished with
  // the text so far, the batcher frees them. How many there were.
  size_t abort_all(const std::string& why, int64_t now, RouterOutput& out);
  bool idle() const { return by_id_.empty(); }

  const RouterStats& stats() const { return stats_; }
  const RouterOptions& options() const { return options_; }

 private:
  struct Live;
  void finish(Live& r, const Finished& f, int64_t now, RouterOutput& out);
  // A job with prompt_logprobs: its prompt and scores in one Tokens, once all have come.
  void send_prompt_if_complete(Live& r, RouterOutput& out);
  void erase(uint64_t id);

  const model::Tokenizer& tokenizer_;
  RouterOptions options_;
  uint64_t next_id_ = 1;
  uint64_t seed_counter_ = 0;
  std::unordered_map<uint64_t, std::unique_ptr<Live>> by_id_;
  std::map<std::pair<ClientId, uint64_t>, uint64_t> by_tag_;  // (client, tag) -> request id
  RouterStats stats_;
};

}  // namespace troupe::actors
