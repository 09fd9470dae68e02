// Trace readers on small files of each public format: arrival times relative
// to the first row, lengths, skipped rows, and malformed rows named by line.
#include "cluster/sim/trace_reader.hpp"

#include <gtest/gtest.h>

#include <sstream>

#include "sim_test_utils.hpp"

namespace troupe::cluster::sim {
namespace {

using test::fixture;

void expect_error(const std::string& path, TraceFormat f, const std::string& where, const std::string& what) {
  try {
    read_trace(path, f);
    FAIL() << "accepted " << path;
  } catch (const std::runtime_error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find(where), std::string::npos) << m;
    EXPECT_NE(m.find(what), std::string::npos) << m;
  }
}

TEST(TraceReader, Azure2023) {
  const Trace t = read_trace(fixture("azure_conv.csv"), TraceFormat::kAzure);
  EXPECT_EQ(t.rows, 6);
  EXPECT_EQ(t.skipped, 1);  // GeneratedTokens 0
  ASSERT_EQ(t.requests.size(), 5u);
  const std::vector<int64_t> at = {0, 4'314'579'000, 4'696'100'000, 6'319'410'000, 13'819'410'000};
  const std::vector<int32_t> in = {374, 396, 91, 1203, 48}, out = {44, 109, 16, 212, 7};
  for (size_t i = 0; i < at.size(); ++i) {
    EXPECT_EQ(t.requests[i].arrival_ns, at[i]) << i;
    EXPECT_EQ(t.requests[i].input_len, in[i]) << i;
    EXPECT_EQ(t.requests[i].output_len, out[i]) << i;
    EXPECT_TRUE(t.requests[i].hash_ids.empty());
  }
}

TEST(TraceReader, Azure2024WithZoneOffsets) {
  const Trace t = read_trace(fixture("azure_2024.csv"), TraceFormat::kAzure);
  ASSERT_EQ(t.requests.size(), 3u);
  EXPECT_EQ(t.requests[1].arrival_ns, 8'850'000);
  EXPECT_EQ(t.requests[2].arrival_ns, 990'070'000);
  EXPECT_EQ(t.requests[2].output_len, 1);
}

TEST(TraceReader, AzureUnsortedRowsComeOutInArrivalOrder) {
  std::istringstream in(
      "TIMESTAMP,ContextTokens,GeneratedTokens\n"
      "2023-11-16 18:15:50.5,10,1\n2023-11-16 18:15:50.0,20,2\n2023-11-16 18:15:50.5,30,3\n");
  const Trace t = read_trace(in, "mem", TraceFormat::kAzure);
  ASSERT_EQ(t.requests.size(), 3u);
  EXPECT_EQ(t.requests[0].input_len, 20);
  EXPECT_EQ(t.requests[1].input_len, 10);  // stable for equal times
  EXPECT_EQ(t.requests[2].input_len, 30);
  EXPECT_EQ(t.requests[2].arrival_ns, 500'000'000);
}

TEST(TraceReader, BurstGpt) {
  const Trace t = read_trace(fixture("burstgpt.csv"), TraceFormat::kBurstGpt);
  EXPECT_EQ(t.rows, 5);
  EXPECT_EQ(t.skipped, 1);  // the trace's failed request (0 response tokens)
  ASSERT_EQ(t.requests.size(), 4u);
  EXPECT_EQ(t.requests[1].arrival_ns, 113'000'000'000);
  EXPECT_EQ(t.requests[1].input_len, 417);
  EXPECT_EQ(t.requests[1].output_len, 276);
  EXPECT_EQ(t.requests[3].arrival_ns, 116'500'000'000);  // its Model field is quoted with a comma
  EXPECT_EQ(t.requests[3].input_len, 20);
}

TEST(TraceReader, BurstGptColumnsFoundByName) {
  std::istringstream in(
      "Session ID,Response tokens,Timestamp,Elapsed time,Request tokens\n"
      "s1,5,10.5,0.3,100\ns2,6,11,0.2,200\n");
  const Trace t = read_trace(in, "mem", TraceFormat::kBurstGpt);
  ASSERT_EQ(t.requests.size(), 2u);
  EXPECT_EQ(t.requests[0].input_len, 100);
  EXPECT_EQ(t.requests[0].output_len, 5);
  EXPECT_EQ(t.requests[1].arrival_ns, 500'000'000);
}

TEST(TraceReader, Mooncake) {
  const Trace t = read_trace(fixture("mooncake.jsonl"), TraceFormat::kMooncake);
  ASSERT_EQ(t.requests.size(), 4u);
  EXPECT_EQ(t.requests[2].arrival_ns, 3'052'000'000);
  EXPECT_EQ(t.requests[3].arrival_ns, 7'100'500'000);
  EXPECT_EQ(t.requests[1].input_len, 1300);
  EXPECT_EQ(t.requests[1].output_len, 12);
  EXPECT_EQ(t.requests[1].hash_ids, (std::vector<uint64_t>{0, 1, 3}));
}

TEST(TraceReader, MaxRequestsKeepsTheFirstRows) {
  TraceOptions o;
  o.max_requests = 2;
  EXPECT_EQ(read_trace(fixture("mooncake.jsonl"), TraceFormat::kMooncake, o).requests.size(), 2u);
  EXPECT_EQ(read_trace(fixture("azure_conv.csv"), TraceFormat::kAzure, o).rows, 2);
}

TEST(TraceReader, MalformedRowsNameTheLine) {
  expect_error(fixture("azure_bad.csv"), TraceFormat::kAzure, "azure_bad.csv:5:", "ContextTokens 'eighty'");
  expect_error(fixture("burstgpt_bad.csv"), TraceFormat::kBurstGpt, "burstgpt_bad.csv:3:", "columns");
  expect_error(fixture("mooncake_bad.jsonl"), TraceFormat::kMooncake, "mooncake_bad.jsonl:2:", "hash_ids");
  // The wrong format for the file: the header lacks the columns.
  expect_error(fixture("burstgpt.csv"), TraceFormat::kAzure, "burstgpt.csv:1:", "'TIMESTAMP'");
  expect_error(fixture("azure_conv.csv"), TraceFormat::kMooncake, "azure_conv.csv:1:", "not JSON");
  expect_error("/nonexistent/trace.csv", TraceFormat::kAzure, "/nonexistent/trace.csv", "cannot read");
}

TEST(TraceReader, MoreMalformedRows) {
  auto bad = [](const std::string& text, TraceFormat f, const std::string& what) {
    std::istringstream in(text);
    try {
      read_trace(in, "t", f);
      ADD_FAILURE() << "accepted: " << text;
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  bad("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-13-01 00:00:00,1,1\n", TraceFormat::kAzure,
      "t:2: TIMESTAMP");
  bad("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.5 PST,1,1\n", TraceFormat::kAzure,
      "t:2:");
  bad("TIMESTAMP,ContextTokens,GeneratedTokens\n5,-1,1\n", TraceFormat::kAzure, "t:2: ContextTokens '-1'");
  bad("Timestamp,Request tokens,Response tokens\n1,\"2,3\n", TraceFormat::kBurstGpt, "t:2: unterminated");
  bad("{\"timestamp\": 0, \"input_length\": 10}\n", TraceFormat::kMooncake, "t:1: missing \"output_length\"");
  bad("{\"timestamp\": -5, \"input_length\": 10, \"output_length\": 1}\n", TraceFormat::kMooncake, "t:1:");
  bad("{\"timestamp\": 0, \"input_length\": 10, \"output_length\": 1, \"hash_ids\": [1, 2]}\n",
      TraceFormat::kMooncake, "more than one per 512-token block");
  bad("", TraceFormat::kAzure, "empty");
}

TEST(TraceReader, FormatNames) {
  for (const char* n : {"azure", "burstgpt", "mooncake"}) EXPECT_STREQ(to_string(parse_trace_format(n)), n);
  EXPECT_THROW(parse_trace_format("sharegpt"), std::invalid_argument);
}

}  // namespace
}  // namespace troupe::cluster::sim
