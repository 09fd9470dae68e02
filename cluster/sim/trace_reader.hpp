#pragma once
// Readers for public LLM serving traces, turned into a workload (arrival
// times relative to the earliest row, input and output lengths):
//
//   azure     Azure LLM inference traces 2023/2024 (AzurePublicDataset), CSV
//             TIMESTAMP,ContextTokens,GeneratedTokens; TIMESTAMP an absolute
//             "YYYY-MM-DD HH:MM:SS[.fraction][+HH:MM]" (or a number of seconds).
//   burstgpt  BurstGPT (HPMLL/BurstGPT), CSV with a header naming at least
//             Timestamp (seconds), Request tokens, Response tokens; other
//             columns (Model, Total tokens, Log Type, Session ID, Elapsed
//             time) are ignored. Rows with 0 response tokens are the trace's
//             failed requests: skipped and counted.
//   mooncake  Mooncake (kvcache-ai/Mooncake), JSON lines {"timestamp" (ms),
//             "input_length", "output_length", "hash_ids"}; each hash id names
//             one block of `mooncake_block_tokens` prompt tokens (512 in the
//             released traces), equal ids meaning equal blocks.
//
// A malformed row is an error (std::runtime_error "FILE:LINE: what"); rows
// whose lengths are 0 are skipped and counted (a request cannot be empty).
// Rows are returned in arrival order (stable for equal times).
#include <cstdint>
#include <istream>
#include <string>
#include <vector>

#include "cluster/sim/workload.hpp"

namespace troupe::cluster::sim {

enum class TraceFormat { kAzure, kBurstGpt, kMooncake };
// "azure", "burstgpt", "mooncake"; std::invalid_argument otherwise.
TraceFormat parse_trace_format(const std::string& text);
const char* to_string(TraceFormat format);

struct TraceOptions {
  int64_t max_requests = 0;             // keep the first N rows in file order; 0 = all
  int32_t mooncake_block_tokens = 512;  // prompt tokens per Mooncake hash id; >= 1
};

struct Trace {
  std::vector<WorkloadRequest> requests;
  int64_t rows = 0;     // data rows read
  int64_t skipped = 0;  // rows dropped: zero lengths (BurstGPT: failed requests)
};

Trace read_trace(const std::string& path, TraceFormat format, const TraceOptions& options = {});
// `origin` names the source in error messages.
Trace read_trace(std::istream& in, const std::string& origin, TraceFormat format,
                 const TraceOptions& options = {});

}  // namespace troupe::cluster::sim
