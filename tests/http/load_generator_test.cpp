// The load generator's pure parts: the request list (one generator with the
// simulator, seeded), Server-Sent Events parsing, base URLs.
#include "cluster/load_generator.hpp"

#include <gtest/gtest.h>

#include <cmath>

#include "cluster/openai_client.hpp"

namespace troupe::cluster {
namespace {

RandomLoadOptions options(uint64_t seed) {
  RandomLoadOptions o;
  o.num_requests = 50;
  o.request_rate = 4;
  o.burstiness = 0.5;
  o.input_len = 60;
  o.output_len = 128;
  o.range_ratio = 0.1;
  o.seed = seed;
  return o;
}

TEST(LoadGenerator, SameSeedSameRequestsAnotherSeedOthers) {
  const auto a = random_load(options(3)), b = random_load(options(3)), c = random_load(options(4));
  ASSERT_EQ(a.size(), 50u);
  bool any_difference = false;
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].arrival_ns, b[i].arrival_ns);
    EXPECT_EQ(a[i].prompt_ids, b[i].prompt_ids);
    EXPECT_EQ(a[i].max_tokens, b[i].max_tokens);
    any_difference |= a[i].prompt_ids != c[i].prompt_ids || a[i].arrival_ns != c[i].arrival_ns;
  }
  EXPECT_TRUE(any_difference);
}

TEST(LoadGenerator, LengthsStayInTheRangeAndArrivalsFollowTheRate) {
  const auto a = random_load(options(1));
  EXPECT_EQ(a[0].arrival_ns, 0);
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_GE(a[i].prompt_ids.size(), 54u);
    EXPECT_LE(a[i].prompt_ids.size(), 66u);
    EXPECT_EQ(a[i].prompt_tokens, static_cast<int32_t>(a[i].prompt_ids.size()));
    EXPECT_GE(a[i].max_tokens, 115);
    EXPECT_LE(a[i].max_tokens, 140);
    for (int32_t id : a[i].prompt_ids) {
      EXPECT_TRUE(id >= 0 && id < 50257);
    }
    if (i > 0) {
      EXPECT_GE(a[i].arrival_ns, a[i - 1].arrival_ns);
    }
  }
  // 49 gaps of mean 1/4 s: the mean gap of this draw is near 0.25 s.
  const double mean_gap = a.back().arrival_ns / 1e9 / 49;
  EXPECT_GT(mean_gap, 0.1);
  EXPECT_LT(mean_gap, 0.5);
  RandomLoadOptions burst = options(1);
  burst.request_rate = std::numeric_limits<double>::infinity();
  for (const auto& r : random_load(burst)) EXPECT_EQ(r.arrival_ns, 0);
  // A dataset's arrivals come from the same generator.
  const auto at = load_arrivals(50, 4, 0.5, 1);
  for (size_t i = 0; i < at.size(); ++i) EXPECT_EQ(at[i], a[i].arrival_ns);
}

TEST(LoadGenerator, BadOptionsAreRefused) {
  RandomLoadOptions o = options(1);
  o.request_rate = 0;
  EXPECT_THROW(random_load(o), std::invalid_argument);
  LoadOptions lo;
  EXPECT_THROW(run_load({}, lo), std::invalid_argument) << "neither --to nor --base-url";
  lo.to = "tcp://127.0.0.1:1";
  lo.base_url = "http://127.0.0.1:1";
  EXPECT_THROW(run_load({}, lo), std::invalid_argument) << "both";
  lo.to.clear();
  lo.base_url = "ftp://x";
  EXPECT_THROW(run_load({}, lo), std::invalid_argument);
}

TEST(SseParser, EventsSplitAnywhereAndInEveryLineEnding) {
  SseParser p;
  const std::string stream =
      ": a comment\n\ndata: {\"a\":1}\n\nevent: x\ndata: two\ndata: lines\r\n\r\ndata:[DONE]\r\r";
  std::vector<std::string> all;
  for (char c : stream) {  // one byte at a time: chunks may split anywhere
    for (auto& e : p.feed(&c, 1)) all.push_back(e);
  }
  EXPECT_EQ(all, (std::vector<std::string>{"{\"a\":1}", "two\nlines", "[DONE]"}));
  SseParser q;
  EXPECT_EQ(q.feed(stream.data(), stream.size()), all);
  EXPECT_TRUE(q.feed("data: half", 10).empty()) << "no event before its blank line";
  EXPECT_EQ(q.feed("\n\n", 2), std::vector<std::string>{"half"});
}

TEST(OpenAiClient, BaseUrlIsAnOrigin) {
  EXPECT_EQ(server_origin("http://127.0.0.1:8000"), "http://127.0.0.1:8000");
  EXPECT_EQ(server_origin("http://127.0.0.1:8000/v1/"), "http://127.0.0.1:8000");
  EXPECT_THROW(server_origin("127.0.0.1:8000"), std::invalid_argument);
  EXPECT_THROW(server_origin("http://h:1/api/v1"), std::invalid_argument);
}

}  // namespace
}  // namespace troupe::cluster
