// Membership: the head's record of worker nodes, driven directly (no
// sockets): registration and its retransmissions, refusals, loss, drain.
#include "cluster/membership.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <variant>

namespace troupe::cluster {
namespace {

using std::chrono::milliseconds;
using transport::Clock;

MembershipOptions options() {
  MembershipOptions o;
  o.liveness.heartbeat_interval = milliseconds(100);
  o.liveness.liveness = 3;
  o.fingerprint = 77;
  o.vocab_size = 50257;
  o.max_workers_per_node = 4;
  return o;
}

transport::Register node(const std::string& name, uint32_t workers) {
  transport::Register r;
  r.node = name;
  for (uint32_t i = 0; i < workers; ++i) {
    transport::WorkerInfo w;
    w.index = i;
    w.device = "cpu";
    w.num_blocks = 64;
    w.block_size = 16;
    w.max_model_len = 1024;
    w.vocab_size = 50257;
    w.fingerprint = 77;
    r.workers.push_back(w);
  }
  return r;
}

using Outcome = std::variant<Membership::Joined, Membership::Refusal>;

Membership::Joined joined(Outcome outcome) {
  if (auto* no = std::get_if<Membership::Refusal>(&outcome)) ADD_FAILURE() << "refused: " << no->detail;
  return std::get<Membership::Joined>(outcome);
}

// The refusal of `outcome`; a failure if it was admitted.
Membership::Refusal refusal(Outcome outcome) {
  if (!std::holds_alternative<Membership::Refusal>(outcome)) {
    ADD_FAILURE() << "admitted";
    return {};
  }
  return std::get<Membership::Refusal>(outcome);
}

std::vector<uint32_t> ids(const transport::Registered& reply) {
  std::vector<uint32_t> out;
  for (const auto& w : reply.workers) out.push_back(w.worker_id);
  return out;
}

// A node sends its register until a reply arrives; what ZeroMQ queued while
// the head was away arrives all at once. Each copy gets the same answer and
// changes nothing.
TEST(Membership, ARetransmittedRegisterGetsTheSameIdsAndChangesNothing) {
  Membership m(options(), 1);
  const auto now = Clock::now();
  const Membership::Joined first = joined(m.on_register("peer-a", node("a", 2), now));
  EXPECT_FALSE(first.again);
  ASSERT_EQ(first.workers.size(), 2u);
  EXPECT_EQ(ids(first.reply), (std::vector<uint32_t>{1, 2}));
  EXPECT_EQ(first.reply.heartbeat_ms, 100);
  EXPECT_EQ(first.reply.liveness, 3);
  for (int copy = 0; copy < 3; ++copy) {
    const Membership::Joined again = joined(m.on_register("peer-a", node("a", 2), now + milliseconds(10)));
    EXPECT_TRUE(again.again);
    EXPECT_TRUE(again.workers.empty());
    EXPECT_TRUE(again.replaced.empty());
    EXPECT_EQ(ids(again.reply), (std::vector<uint32_t>{1, 2}));
  }
  EXPECT_EQ(m.num_nodes(), 1u);
  EXPECT_EQ(m.worker_id("peer-a", 1), std::optional<uint64_t>(2));
  // A copy counts as a beat: 3 intervals of 100 ms after the first
  // register the node is not lost, 3 after the last copy it is.
  EXPECT_TRUE(m.take_lost(now + milliseconds(305)).empty());
  EXPECT_EQ(m.take_lost(now + milliseconds(310)), (std::vector<uint64_t>{1, 2}));
}

// The same peer with other workers replaces its record; a node back on a new
// socket (another peer) gets new ids, never reused ones.
TEST(Membership, AnotherRegisterReplacesAndANewPeerGetsNewIds) {
  Membership m(options(), 5);
  const auto now = Clock::now();
  joined(m.on_register("peer-a", node("a", 2), now));
  transport::Register bigger = node("a", 3);
  const Membership::Joined replaced = joined(m.on_register("peer-a", bigger, now));
  EXPECT_FALSE(replaced.again);
  EXPECT_EQ(replaced.replaced, (std::vector<uint64_t>{5, 6}));
  EXPECT_EQ(ids(replaced.reply), (std::vector<uint32_t>{7, 8, 9}));
  transport::Register other_pool = node("a", 3);
  other_pool.workers[1].num_blocks = 32;
  EXPECT_FALSE(joined(m.on_register("peer-a", other_pool, now)).again) << "a changed report is no copy";
  const Membership::Joined back = joined(m.on_register("peer-b", node("a", 3), now));
  EXPECT_FALSE(back.again);
  EXPECT_TRUE(back.replaced.empty());
  EXPECT_EQ(ids(back.reply), (std::vector<uint32_t>{13, 14, 15}));
  EXPECT_EQ(m.num_nodes(), 2u);
}

TEST(Membership, RefusesNodesThatCannotServeTheHeadsModel) {
  Membership m(options(), 1);
  const auto now = Clock::now();
  auto refused = [&](transport::Register r, const std::string& words) {
    const Membership::Refusal no = refusal(m.on_register("peer", r, now));
    EXPECT_NE(no.detail.find(words), std::string::npos) << no.detail;
  };
  refused(node("a", 0), "at least one worker");
  refused(node("a", 5), "at most 4 workers");
  transport::Register twice = node("a", 2);
  twice.workers[1].index = 0;
  refused(twice, "index given twice");
  transport::Register other = node("a", 1);
  other.workers[0].fingerprint = 78;
  refused(other, "serves another model");
  transport::Register vocab = node("a", 1);
  vocab.workers[0].vocab_size = 100;
  refused(vocab, "vocabulary 100");
  transport::Register pool = node("a", 1);
  pool.workers[0].num_blocks = 0;
  refused(pool, "unusable KV pool");
  EXPECT_EQ(m.num_nodes(), 0u);
}

// What a node is told when refused names what it can fix, and nothing of the
// head's model: the fingerprint and vocabulary stay in the head's log.
TEST(Membership, ARefusalTellsTheNodeNothingAboutTheHeadsModel) {
  Membership m(options(), 1);
  transport::Register other = node("a", 1);
  other.workers[0].fingerprint = 78;
  other.workers[0].vocab_size = 100;
  const Membership::Refusal no = refusal(m.on_register("peer", other, Clock::now()));
  EXPECT_NE(no.reply.reason.find("serves another model"), std::string::npos) << no.reply.reason;
  for (const char* secret : {"77", "50257"}) {
    EXPECT_EQ(no.reply.reason.find(secret), std::string::npos) << no.reply.reason;
    EXPECT_NE(no.detail.find(secret), std::string::npos) << no.detail;
  }
}

// --max-nodes: one node more is refused (a node already in, registering
// again, is not counted twice); a node that leaves makes room.
TEST(Membership, NoMoreNodesThanMaxNodes) {
  MembershipOptions o = options();
  o.max_nodes = 2;
  Membership m(o, 1);
  const auto now = Clock::now();
  joined(m.on_register("peer-a", node("a", 1), now));
  joined(m.on_register("peer-b", node("b", 1), now));
  EXPECT_TRUE(joined(m.on_register("peer-b", node("b", 1), now)).again);
  const Membership::Refusal no = refusal(m.on_register("peer-c", node("c", 1), now));
  EXPECT_NE(no.reply.reason.find("--max-nodes 2"), std::string::npos) << no.reply.reason;
  EXPECT_EQ(m.forget_node("peer-a"), (std::vector<uint64_t>{1}));
  joined(m.on_register("peer-c", node("c", 1), now));
  EXPECT_EQ(m.num_nodes(), 2u);
}

// A node's KV pool must fit the memory it declares, which must fit the
// head's bound: the head keeps state for every block a node reports, so a
// node claiming two billion blocks is refused instead of costing the head
// its memory.
TEST(Membership, AWorkersKvPoolMustFitItsDeclaredMemory) {
  MembershipOptions o = options();
  o.kv_values_per_token = 250;  // 1000 bytes a token at float32
  o.max_worker_kv_bytes = int64_t{1} << 30;
  Membership m(o, 1);
  const auto now = Clock::now();
  auto with = [](int32_t blocks, int64_t kv_bytes) {
    transport::Register r = node("a", 1);
    r.workers[0].num_blocks = blocks;
    r.workers[0].kv_bytes = kv_bytes;
    return r;
  };
  EXPECT_NE(refusal(m.on_register("p", with(64, 0), now)).detail.find("declares 0 bytes"), std::string::npos);
  EXPECT_NE(refusal(m.on_register("p", with(64, 64 * 16 * 1000 - 1), now)).detail.find("need 1024000 bytes"),
            std::string::npos);
  EXPECT_NE(refusal(m.on_register("p", with(2'000'000'000, int64_t{1} << 50), now)).detail.find("at most"),
            std::string::npos);
  EXPECT_NE(
      refusal(m.on_register("p", with(60'000, int64_t{1} << 31), now)).detail.find("at most 1073741824"),
      std::string::npos);
  EXPECT_EQ(m.num_nodes(), 0u);
  joined(m.on_register("p", with(64, 64 * 16 * 1000), now));

  // A bfloat16 pool needs half the bytes; an unknown KV dtype is refused.
  MembershipOptions lenient = o;
  lenient.allow_mixed_dtypes = true;
  Membership half(lenient, 1);
  transport::Register bf = with(64, 64 * 16 * 500 - 1);
  bf.workers[0].kv_dtype = "bfloat16";
  EXPECT_NE(refusal(half.on_register("p", bf, now)).detail.find("need 512000 bytes"), std::string::npos);
  bf.workers[0].kv_bytes = 64 * 16 * 500;
  joined(half.on_register("p", bf, now));
  bf.workers[0].kv_dtype = "float8";
  EXPECT_NE(refusal(half.on_register("q", bf, now)).reply.reason.find("unknown KV dtype 'float8'"),
            std::string::npos);
}

TEST(Membership, ADrainedNodeIsForgottenWithItsLastWorker) {
  Membership m(options(), 1);
  const auto now = Clock::now();
  joined(m.on_register("peer-a", node("a", 2), now));
  EXPECT_EQ(m.drain("peer-a"), (std::vector<uint64_t>{1, 2}));
  EXPECT_EQ(m.forget_worker(1), std::nullopt);
  // A late copy of its register names the worker it still has.
  const Membership::Joined late = joined(m.on_register("peer-a", node("a", 2), now));
  EXPECT_TRUE(late.again);
  EXPECT_EQ(ids(late.reply), (std::vector<uint32_t>{2}));
  EXPECT_EQ(m.address(2), (std::optional<std::pair<std::string, uint32_t>>{{"peer-a", 1}}));
  EXPECT_EQ(m.forget_worker(2), std::optional<std::string>("peer-a"));
  EXPECT_EQ(m.num_nodes(), 0u);
  EXPECT_FALSE(m.on_message("peer-a", now));
}

}  // namespace
}  // namespace troupe::cluster

namespace troupe::cluster {
namespace {

// A worker must run the head's --dtype (a request's tokens would otherwise
// depend on where it lands) unless the head allows mixed dtypes.
TEST(Membership, AWorkerOfAnotherDtypeIsRefusedUnlessMixedDtypesAreAllowed) {
  Membership m(options(), 1);
  const auto now = Clock::now();
  transport::Register bf16 = node("bf", 1);
  bf16.workers[0].dtype = "bfloat16";
  const Membership::Refusal no = refusal(m.on_register("peer-bf", bf16, now));
  EXPECT_NE(no.reply.reason.find("--dtype bfloat16, the head float32"), std::string::npos) << no.reply.reason;
  EXPECT_NE(no.reply.reason.find("--allow-mixed-dtypes"), std::string::npos);
  EXPECT_EQ(joined(m.on_register("peer-fp", node("fp", 1), now)).workers.size(), 1u);

  MembershipOptions mixed = options();
  mixed.allow_mixed_dtypes = true;
  Membership lenient(mixed, 1);
  const Membership::Joined j = joined(lenient.on_register("peer-bf", bf16, now));
  ASSERT_EQ(j.workers.size(), 1u);
  EXPECT_EQ(j.workers[0].info.dtype, "bfloat16");
  MembershipOptions head_bf16 = options();
  head_bf16.dtype = "bfloat16";
  Membership bf_head(head_bf16, 1);
  EXPECT_EQ(joined(bf_head.on_register("peer-bf", bf16, now)).workers.size(), 1u);
  refusal(bf_head.on_register("peer-fp", node("fp", 1), now));
  // int8 (--quantization int8) is a dtype of its own.
  transport::Register i8 = node("i8", 1);
  i8.workers[0].dtype = "int8";
  EXPECT_NE(refusal(bf_head.on_register("peer-i8", i8, now)).reply.reason.find("int8, the head bfloat16"),
            std::string::npos);
  MembershipOptions head_i8 = options();
  head_i8.dtype = "int8";
  Membership i8_head(head_i8, 1);
  EXPECT_EQ(joined(i8_head.on_register("peer-i8", i8, now)).workers.size(), 1u);
  refusal(i8_head.on_register("peer-fp", node("fp", 1), now));
}

// The same for the KV cache's storage (--kv-cache-dtype).
TEST(Membership, AWorkerOfAnotherKvDtypeIsRefusedUnlessMixedDtypesAreAllowed) {
  Membership m(options(), 1);
  const auto now = Clock::now();
  transport::Register bf16 = node("bf", 1);
  bf16.workers[0].kv_dtype = "bfloat16";
  const Membership::Refusal no = refusal(m.on_register("peer-bf", bf16, now));
  EXPECT_NE(no.reply.reason.find("--kv-cache-dtype bfloat16, the head float32"), std::string::npos)
      << no.reply.reason;
  MembershipOptions mixed = options();
  mixed.allow_mixed_dtypes = true;
  Membership lenient(mixed, 1);
  EXPECT_EQ(joined(lenient.on_register("peer-bf", bf16, now)).workers[0].info.kv_dtype, "bfloat16");
  MembershipOptions head_bf16 = options();
  head_bf16.kv_dtype = "bfloat16";
  Membership bf_head(head_bf16, 1);
  EXPECT_EQ(joined(bf_head.on_register("peer-bf", bf16, now)).workers.size(), 1u);
  refusal(bf_head.on_register("peer-fp", node("fp", 1), now));
}

}  // namespace
}  // namespace troupe::cluster
