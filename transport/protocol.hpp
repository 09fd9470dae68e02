#pragma once
// The troupe wire protocol, version 1: every message that crosses a process.
// docs/protocol.md documents each field, who sends it, and the rules below.
//
// Framing (ZeroMQ): a DEALER sends one frame, the body; the ROUTER that
// receives it sees [peer identity, body] and answers [peer identity, body].
// The body is one msgpack map with string keys:
//
//   "p": "troupe"   protocol name
//   "v": 1          protocol version (kProtocolVersion)
//   "t": "<type>"   message type (type_name below)
//   ...             the type's fields
//
// Versioning: adding an optional key keeps the version (readers ignore keys
// they do not know); removing a key, making one required or changing its
// meaning bumps it. A peer answers any other version with an `error` frame
// (code bad_version) in its own version; the layout of `error` never changes.
//
// StepPlan and StepResult are compact: their items are msgpack arrays, not
// maps, and a running sequence's decode step costs a handful of bytes
// whatever its context length (see docs/protocol.md for the byte counts).
//
// decode() never throws and never trusts a length: every claimed array,
// map or string length is checked against the bytes left, every integer
// against its field's type, and floats must be finite (logprobs may be -inf).
// Meaning (temperature >= 0, known sequence ids, ...) is checked by whoever
// acts on the message: the router, core::SequenceTable.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "core/request.hpp"
#include "core/sampling_params.hpp"
#include "core/step_plan.hpp"

namespace troupe::transport {

inline constexpr std::string_view kProtocolName = "troupe";
inline constexpr int kProtocolVersion = 1;
// Default bound on one frame body on the worker socket, both ways (--max-frame-bytes).
inline constexpr size_t kDefaultMaxFrameBytes = size_t{16} << 20;
// Default bound on a client's frame at the head (--max-client-frame-bytes):
// a valid submit of a whole GPT-2 context in ids, 16 stop strings of 1 KiB
// and 1024 logit biases is under 70 KiB.
inline constexpr size_t kDefaultMaxClientFrameBytes = size_t{1} << 20;

// Why a frame could not be read (and the `code` of an `error` frame).
enum class ErrorCode {
  kMalformed,    // not msgpack, truncated, trailing bytes, not a map, nested too deep, not a troupe frame
  kBadVersion,   // "v" is not kProtocolVersion
  kUnknownType,  // "t" names no message type
  kBadField,     // a required key is missing, or a value has the wrong type or range
  kTooLarge,     // the frame is over the receiver's max_frame_bytes
  kUnexpected,   // a valid message that this peer does not take here (a plan sent to the router)
  kTooSlow,      // the receiver read too slowly: what was queued for it was sent, then its jobs ended
};
const char* to_string(ErrorCode code);  // "malformed", "bad_version", ...

// ---------------------------------------------------------------------------
// Client <-> router (the frontend socket). `tag` is the client's own id for a
// job, unique among its unfinished jobs; every reply about the job echoes it.

// client -> router: one generation job. Exactly one of prompt / prompt_ids.
struct Submit {
  uint64_t tag = 0;
  std::optional<std::string> prompt;               // text, tokenized by the router
  std::optional<std::vector<int32_t>> prompt_ids;  // token ids
  int32_t max_tokens = 16;                         // tokens to generate at most
  float temperature = 1.0f;                        // 0 = greedy
  int32_t top_k = 0;                               // 0 = off
  float top_p = 1.0f;                              // 1 = off
  std::optional<uint64_t> seed;                    // nullopt: the router picks one
  std::vector<std::string> stop;                   // stop strings (text ends before the first match)
  int32_t logprobs = -1;                           // -1 = none; K = chosen token's logprob + top K
  bool ignore_eos = false;
  int32_t priority = 0;                               // lower runs first
  float presence_penalty = 0.0f;                      // core::SamplingParams: [-2, 2], 0 = off
  float frequency_penalty = 0.0f;                     // [-2, 2], 0 = off
  std::vector<std::pair<int32_t, float>> logit_bias;  // (token id, bias in [-100, 100]), any order
  float repetition_penalty = 1.0f;                    // (0, 10], 1 = off
  // -1 = none; K in [0, 20]: the logprob and rank of every prompt token after
  // the first, with the top K alternatives (max_tokens may then be 0).
  int32_t prompt_logprobs = -1;
};

// router -> client: the job is queued under request_id.
struct Accepted {
  uint64_t tag = 0;
  uint64_t request_id = 0;
};

enum class RejectCode { kBusy, kInvalid, kTooLong, kNoWorkers, kShuttingDown };
const char* to_string(RejectCode code);  // "busy", "invalid", "too_long", "no_workers", "shutting_down"

// router -> client: the job will not run (nothing else follows for this tag).
struct Rejected {
  uint64_t tag = 0;
  RejectCode code = RejectCode::kInvalid;
  std::string message;
};

// router -> client: new output of a running job.
struct Tokens {
  uint64_t tag = 0;
  std::string text;                          // text that became safe to show (may be empty)
  std::vector<int32_t> ids;                  // tokens generated since the last Tokens
  std::vector<core::SampledToken> logprobs;  // empty, or one per id (its `id` equals ids[i])
  // A job with prompt_logprobs: once, before any generated id, the prompt's
  // tokens and one score per prompt_ids[1..] (its `id` equals the prompt's
  // token, `rank` given). Both empty otherwise.
  std::vector<int32_t> prompt_ids;
  std::vector<core::SampledToken> prompt_logprobs;
  std::string prompt_text;  // with prompt_ids: the prompt decoded (what an echo shows)
};

// Milliseconds of one job, measured at the router; -1 = never reached.
struct Timings {
  double queue_ms = 0;  // submit -> first scheduled
  double ttft_ms = 0;   // submit -> first token
  double e2e_ms = 0;    // submit -> finished
};

// router -> client: the last message about a job.
struct Finished {
  uint64_t tag = 0;
  core::FinishReason finish_reason = core::FinishReason::kLength;
  std::string text;   // the last delta (text held back by stop-string matching)
  std::string error;  // finish_reason kError: what went wrong
  core::Usage usage;
  Timings timings;
};

// client -> router: stop a job (answered by its Finished, reason cancelled).
struct Cancel {
  uint64_t tag = 0;
};

// client -> router: ask for a StatusReply.
struct Status {};

struct WorkerStatus {
  uint32_t id = 0;          // worker id given by the head
  std::string node;         // the node's name (host or process)
  std::string device;       // "cpu", "cuda:0"
  std::string state;        // "ready", "draining", "lost"
  int32_t kv_used = 0;      // KV blocks in use
  int32_t kv_total = 0;     // KV blocks in the pool
  int32_t running = 0;      // sequences running
  int32_t waiting = 0;      // sequences placed on it, not yet running
  double tokens_per_s = 0;  // output tokens/s, recent
  uint64_t tokens = 0;      // output tokens since it joined
  uint64_t steps = 0;       // steps it ran
  double busy_s = 0;        // seconds it spent running steps
  double idle_s = 0;        // seconds it waited for a plan between steps
};

// router -> client.
struct StatusReply {
  std::vector<WorkerStatus> workers;
  // Faults since the head started (optional on the wire; 0 when absent).
  uint64_t workers_lost = 0;       // gone: missed heartbeats, exited
  uint64_t workers_hung = 0;       // a step past its deadline: fenced, restarted or reset
  uint64_t workers_broken = 0;     // a result that did not fit its plan
  uint64_t requests_moved = 0;     // unfinished requests moved off a worker that left
  uint64_t tokens_recomputed = 0;  // their tokens, whose KV was computed again
  int64_t queue_depth = 0;         // jobs waiting for a worker
  int64_t max_queue = 0;           // --max-queue
  uint64_t requests_served = 0;    // finished, any reason
  uint64_t requests_running = 0;   // accepted, not finished
  uint64_t requests_rejected = 0;
  double uptime_s = 0;
};

// ---------------------------------------------------------------------------
// Batcher (head) <-> worker node (the backend socket). One node (process) may
// host several workers, told apart by their index on the node.

// What a worker can do; the head refuses a worker whose fingerprint differs
// from its own model's, or whose KV pool its declared memory cannot hold.
struct WorkerInfo {
  uint32_t index = 0;         // on the node, 0..n-1
  std::string device;         // "cpu", "cuda:1"
  int32_t num_blocks = 0;     // KV blocks in its pool
  int32_t block_size = 0;     // token slots per block
  int32_t max_model_len = 0;  // positions the model takes
  int32_t vocab_size = 0;
  int32_t threads = 0;       // CPU threads it uses (0 = not a CPU worker)
  uint64_t fingerprint = 0;  // hash of the model's config and weights
  int64_t kv_bytes = 0;      // bytes of memory its KV pool takes (num_blocks x a block's bytes); 0 = not said
  std::string cost;          // its step-cost model (`troupe profile`'s "cost" object, JSON text); "" = none
  std::string dtype = "float32";  // its weights' storage (--dtype, --quantization): float32, bfloat16, int8
  std::string kv_dtype = "float32";  // its KV cache's storage (--kv-cache-dtype): "float32" or "bfloat16"
};

// node -> head: first message of a node (again after a reconnect).
struct Register {
  std::string node;
  std::vector<WorkerInfo> workers;
};

struct WorkerId {
  uint32_t index = 0;      // on the node
  uint32_t worker_id = 0;  // cluster-wide, given by the head
};

// head -> node: welcome; from now on both sides heartbeat.
struct Registered {
  std::vector<WorkerId> workers;
  int32_t heartbeat_ms = 1000;  // interval of heartbeats, both ways
  int32_t liveness = 3;         // intervals of silence after which a peer is lost
};

// head -> node: not admitted (different model, protocol, ...); the node exits.
struct Refused {
  std::string reason;
};

// head -> node: one step for one worker. A worker's plans are numbered by
// their step_id, 1, 2, 3, ...; the node runs each once, in that order.
struct Plan {
  uint32_t worker = 0;  // index on the node
  core::StepPlan plan;
  uint64_t ack = 0;  // the head holds this worker's results up to this step id (the node may forget them)
};

// node -> head: what a worker's step produced.
struct Result {
  uint32_t worker = 0;  // index on the node
  core::StepResult result;
};

// node -> head, in a heartbeat: where one worker's step stream stands.
struct WorkerProgress {
  uint32_t index = 0;           // on the node
  uint64_t plans_received = 0;  // every plan up to this step id has arrived (in order)
  uint64_t results_sent = 0;    // every result up to this step id has been sent
  uint64_t steps_done = 0;      // steps the worker's thread has finished since it started
  int64_t running_ms = 0;       // how long the step it runs now has been running; 0 = idle
};

// head -> node, in a heartbeat: the results the head holds.
struct WorkerAck {
  uint32_t index = 0;             // on the node
  uint64_t results_received = 0;  // every result up to this step id has arrived
};

// Either way, every heartbeat interval (and any message counts as a beat).
// The node's carry each worker's progress, the head's its acks; a side that
// finds the other short of what it sent resends it (docs/protocol.md).
struct Heartbeat {
  std::vector<WorkerProgress> progress;  // node -> head
  std::vector<WorkerAck> acks;           // head -> node
};
// node -> head: the node is leaving (SIGTERM); head -> node: leave when done.
struct Drain {};
// head -> node: exit now; node -> head: the node is gone.
struct Shutdown {};
// head -> node: the head has let this node's workers go (a step past its
// deadline): start over with fresh workers and register again, as a new node.
struct Reset {
  std::string reason;
};

// Either way: a frame could not be read or is not accepted here.
struct Error {
  ErrorCode code = ErrorCode::kMalformed;
  std::string message;
  std::optional<uint64_t> tag;  // the job's tag, when the bad frame was about one
};

using Message =
    std::variant<Submit, Accepted, Rejected, Tokens, Finished, Cancel, Status, StatusReply, Register,
                 Registered, Refused, Plan, Result, Heartbeat, Drain, Shutdown, Error, Reset>;

// The "t" of a message: "submit", "accepted", "rejected", "tokens", "finished",
// "cancel", "status", "status_reply", "register", "registered", "refused",
// "plan", "result", "heartbeat", "drain", "shutdown", "error", "reset".
const char* type_name(const Message& message);

// One frame body. Never throws (bar std::bad_alloc).
std::string encode(const Message& message);

struct DecodeError {
  ErrorCode code = ErrorCode::kMalformed;
  std::string message;          // names the key path: "submit.stop[2]: expected a string, got an integer"
  std::string type;             // the frame's "t" when it was readable, else empty
  std::optional<uint64_t> tag;  // the frame's "tag" when it was a readable unsigned integer
};

struct Decoded {
  std::optional<Message> message;  // set on success
  DecodeError error;               // meaningful when !message
  bool ok() const { return message.has_value(); }
};

// Bounds on a submit's fields, enforced while it is read (bad_field, with the
// tag, before the elements past a bound are read or stored): what a client
// frame may make the reader do. 0 = no bound of that kind.
struct SubmitLimits {
  size_t max_stops = 16;         // stop strings
  size_t max_stop_bytes = 1024;  // bytes of one stop string
  size_t max_prompt_bytes = 0;   // bytes of `prompt`
  size_t max_prompt_ids = 0;     // elements of `prompt_ids`
  size_t max_logit_bias = 1024;  // entries of `logit_bias`
};

// Reads one frame body. Frames over max_frame_bytes are refused before any
// parsing (kTooLarge). Never throws, whatever the bytes.
Decoded decode(std::string_view bytes, size_t max_frame_bytes = kDefaultMaxFrameBytes,
               const SubmitLimits& limits = {});

// The `error` frame that answers a frame which failed to decode.
Error error_reply(const DecodeError& error);

}  // namespace troupe::transport
