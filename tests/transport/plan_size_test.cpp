// Bytes on the wire per decode step: a running sequence costs the same few
// bytes at any context length (only the width of its position's integer
// grows), in the plan and in the result.
#include <gtest/gtest.h>

#include <iostream>

#include "transport/protocol.hpp"

namespace troupe::transport {
namespace {

// A decode step of S running sequences at context length ctx: each runs one
// token at position ctx, needs no new block, and samples.
std::string decode_plan(int num_seqs, int32_t ctx) {
  core::StepPlan p;
  p.step_id = 123456;
  for (int i = 0; i < num_seqs; ++i) p.work.push_back({uint64_t(1000 + i), ctx, 1, {}, true});
  return encode(Plan{0, p});
}

// Its result: one greedy token per sequence (ids above 255, as most are).
std::string decode_result(int num_seqs) {
  core::StepResult r;
  r.step_id = 123456;
  r.forward_ms = 12.5;
  r.idle_ms = 0.25;
  for (int i = 0; i < num_seqs; ++i) r.outputs.push_back({uint64_t(1000 + i), {30000, 0.0f, {}, 0}});
  return encode(Result{0, r});
}

TEST(PlanSize, DecodeStepBytesDoNotGrowWithContext) {
  for (int s : {1, 16, 256}) {
    const size_t at10 = decode_plan(s, 10).size();
    const size_t at1000 = decode_plan(s, 1000).size();
    const size_t at100k = decode_plan(s, 100000).size();
    // Positions < 128 take 1 byte, < 65536 take 3, < 2^32 take 5: the only difference.
    EXPECT_EQ(at1000 - at10, size_t(2 * s)) << s << " sequences";
    EXPECT_EQ(at100k - at10, size_t(4 * s)) << s << " sequences";
  }
}

TEST(PlanSize, BytesPerSequencePerDecodeStep) {
  // 16 and 256 items both take a 3-byte array header: the difference is the items alone.
  const double plan_per_seq = double(decode_plan(256, 1000).size() - decode_plan(16, 1000).size()) / 240;
  const double result_per_seq = double(decode_result(256).size() - decode_result(16).size()) / 240;
  // [seq_id, start_pos, num_tokens, [], sample] with a 3-byte id and position.
  EXPECT_EQ(plan_per_seq, 10.0);
  // [seq_id, token id] with 3-byte id and token.
  EXPECT_EQ(result_per_seq, 7.0);
  std::cout << "wire bytes per sequence per decode step (ids >= 256, context 1000): plan " << plan_per_seq
            << ", result " << result_per_seq << "; fixed per frame: plan " << decode_plan(0, 1000).size()
            << ", result " << decode_result(0).size() << "\n";
}

// A block boundary adds the new block's id to that one step only.
TEST(PlanSize, NewBlockCostsItsIdOnce) {
  core::StepPlan p;
  p.work.push_back({1000, 1024, 1, {}, true});
  const size_t without = encode(Plan{0, p}).size();
  p.work[0].new_blocks = {4000};
  EXPECT_EQ(encode(Plan{0, p}).size() - without, 3u);
}

}  // namespace
}  // namespace troupe::transport
