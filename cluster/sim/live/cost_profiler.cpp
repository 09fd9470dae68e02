#include "cluster/sim/live/cost_profiler.hpp"

#include <ATen/Parallel.h>
#include <torch/version.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <ctime>
#include <stdexcept>

#include "cluster/sim/random.hpp"
#include "core/host_info.hpp"
#include "model/paged_kv_cache.hpp"
#include "model/step_executor.hpp"
#include "model/threading.hpp"

namespace troupe::cluster {
namespace {

using Clock = std::chrono::steady_clock;

struct Item {
  int32_t start = 0, n = 1;
  bool sample = true;
};

struct Point {
  sim::MeasuredStep m;
  std::vector<Item> items;
  bool heldout = false;
  int64_t kv_tokens() const {
    int64_t t = 0;
    for (const Item& i : items) t += i.start + i.n;
    return t;
  }
  int64_t tokens() const {
    int64_t t = 0;
    for (const Item& i : items) t += i.n;
    return t;
  }
};

struct Limits {
  int32_t n_positions, chunk, max_tokens;
  int64_t max_kv;
};

// `decodes` one-token items, each reading `context` earlier tokens.
void add_decodes(Point& p, int32_t decodes, int32_t context) {
  for (int32_t d = 0; d < decodes; ++d) p.items.push_back({context, 1, true});
  p.m.decode_seqs = decodes;
  p.m.decode_context = static_cast<int64_t>(decodes) * (context + 1);
}

// Prompt chunks of at most `chunk` tokens covering `prefill` tokens, then
// add_decodes'.
Point grid_point(int32_t prefill, int32_t decodes, int32_t context, const Limits& l) {
  Point p;
  for (int32_t left = prefill; left > 0;) {
    const int32_t n = std::min(left, l.chunk);
    p.items.push_back({0, n, true});
    left -= n;
    ++p.m.prefill_seqs;
  }
  p.m.prefill_tokens = prefill;
  add_decodes(p, decodes, context);
  return p;
}

// One prompt chunk of n tokens continuing a prompt at position `start` (a
// chunked prefill's later chunk), then add_decodes'.
Point continuing_point(int32_t start, int32_t n, int32_t decodes, int32_t context) {
  Point p;
  p.items.push_back({start, n, true});
  p.m.prefill_tokens = n;
  p.m.prefill_seqs = 1;
  add_decodes(p, decodes, context);
  return p;
}

std::vector<Point> grid(const ProfileOptions& o, const Limits& l) {
  const int32_t np = l.n_positions;
  std::vector<int32_t> prefills =
      o.quick ? std::vector<int32_t>{0, 8, 32, 96} : std::vector<int32_t>{0, 16, 64, 256, 512, 1024, 2048};
  std::vector<int32_t> decodes =
      o.quick ? std::vector<int32_t>{0, 1, 4, 16} : std::vector<int32_t>{0, 1, 2, 4, 8, 16, 32, 64, 128, 256};
  std::vector<int32_t> contexts =
      o.quick ? std::vector<int32_t>{np / 8, np / 2} : std::vector<int32_t>{np / 16, np / 4, 3 * np / 4};
  for (int32_t& c : contexts) c = std::clamp(c, 0, std::max(0, np - 2));
  std::vector<Point> out;
  for (int32_t p : prefills) {
    for (int32_t d : decodes) {
      if (p + d == 0 || p + d > l.max_tokens) continue;
      for (int32_t c : contexts) {
        Point pt = grid_point(p, d, c, l);
        if (pt.kv_tokens() <= l.max_kv) out.push_back(std::move(pt));
        if (d == 0) break;  // the context of no decodes does not matter
      }
    }
  }
  // Chunks that continue a prompt. With every chunk above starting at
  // position 0, a chunk's attention pairs follow from its tokens, and the fit
  // could not tell them apart: it priced them at 0 and put their cost on the
  // tokens, so a step continuing a long prompt (as half the held-out steps'
  // chunks do, and a chunked prefill's) came out up to 32% short (int8 on a
  // Xeon: held out p90 14%, 4.1% with these points).
  const std::vector<int32_t> chunks =
      o.quick ? std::vector<int32_t>{8, 32} : std::vector<int32_t>{16, 64, 256, 512};
  const int32_t with_decodes = o.quick ? 4 : 16;
  for (int32_t n : chunks) {
    if (n > l.chunk) continue;
    for (int32_t c : contexts) {
      if (c < 1 || c + n > np - 1) continue;
      for (int32_t d : {0, with_decodes}) {
        if (n + d > l.max_tokens) continue;
        Point pt = continuing_point(c, n, d, c);
        if (pt.kv_tokens() <= l.max_kv) out.push_back(std::move(pt));
      }
    }
  }
  return out;
}

// A step as a busy scheduler forms it: decodes of differing contexts, a few
// prompt chunks, some continuing a prompt, the last chunk of a prompt sampling.
Point random_point(sim::Random& rng, const Limits& l) {
  for (;;) {
    Point p;
    p.heldout = true;
    const auto decodes = static_cast<int32_t>(std::floor(
                             std::exp(rng.uniform() * std::log(std::min(l.max_tokens, 256) + 1.0)))) -
                         1;
    for (int32_t d = 0; d < decodes; ++d) {
      const auto c = static_cast<int32_t>(rng.uniform_int(0, std::max(0, l.n_positions - 2)));
      p.items.push_back({c, 1, true});
      p.m.decode_context += c + 1;
    }
    p.m.decode_seqs = decodes;
    const auto chunks = rng.uniform_int(decodes == 0 ? 1 : 0, 3);
    for (int64_t k = 0; k < chunks; ++k) {
      const auto n = static_cast<int32_t>(rng.uniform_int(2, std::max(2, l.chunk)));
      const auto start = static_cast<int32_t>(
          rng.uniform() < 0.5 ? 0 : rng.uniform_int(0, std::max(0, l.n_positions - n - 1)));
      p.items.push_back({start, n, rng.uniform() < 0.7});
      p.m.prefill_tokens += n;
      ++p.m.prefill_seqs;
    }
    if (p.tokens() >= 1 && p.tokens() <= l.max_tokens && p.kv_tokens() <= l.max_kv) return p;
  }
}

int64_t blocks_for(int64_t tokens, int64_t bs) { return (tokens + bs - 1) / bs; }

}  // namespace

sim::CostProfile profile_worker(const model::Gpt2& gpt, const ProfileOptions& in) {
  ProfileOptions o = in;
  if (o.reps == 0) o.reps = o.quick ? 3 : 5;
  if (o.heldout == 0) o.heldout = o.quick ? 8 : 40;
  if (o.max_kv_tokens == 0) o.max_kv_tokens = o.quick ? 4096 : 32768;
  if (o.max_batched_tokens == 0) o.max_batched_tokens = o.quick ? 256 : 2048;
  if (o.reps < 1 || o.heldout < 1 || o.block_size < 1 || o.max_kv_tokens < 1 || o.max_batched_tokens < 1)
    throw std::invalid_argument(
        "profile: reps, held-out points, block size, KV tokens and step size must be >= 1");
  const model::Gpt2Config& cfg = gpt.config();
  Limits lim{cfg.n_positions, std::max(1, cfg.n_positions / 2), o.max_batched_tokens, o.max_kv_tokens};
  if (lim.max_tokens > lim.max_kv) lim.max_tokens = static_cast<int32_t>(lim.max_kv);

  std::vector<Point> points = grid(o, lim);
  sim::Random rng(o.seed ^ 0x9f0f11e);
  for (int32_t i = 0; i < o.heldout; ++i) points.push_back(random_point(rng, lim));
  int64_t max_blocks = 0;
  for (const Point& p : points) {
    int64_t b = 0;
    for (const Item& it : p.items) b += blocks_for(it.start + it.n, o.block_size);
    max_blocks = std::max(max_blocks, b);
  }
  model::PagedKvCache cache(cfg, max_blocks, o.block_size, gpt.device(), o.kv_dtype);
  model::StepExecutor exec(gpt, cache);

  auto chunks_of = [&](const Point& p) {
    std::vector<core::SeqChunk> chunks;
    int32_t next_block = 0;
    uint64_t id = 1;
    for (const Item& it : p.items) {
      core::SeqChunk c;
      c.seq_id = id++;
      c.start_pos = it.start;
      for (int32_t k = 0; k < it.n; ++k)
        c.token_ids.push_back(static_cast<int32_t>(rng.uniform_int(0, cfg.vocab_size - 1)));
      for (int64_t b = 0; b < blocks_for(it.start + it.n, o.block_size); ++b)
        c.block_table.push_back(next_block++);
      c.sample = it.sample;
      c.sampling.temperature = 0;  // greedy: the simulator's requests sample greedily
      chunks.push_back(std::move(c));
    }
    return chunks;
  };
  auto time_once = [&](const std::vector<core::SeqChunk>& chunks) {
    std::vector<core::SeqFailure> failures;
    std::vector<core::PromptScores> scores;
    const auto t0 = Clock::now();
    exec.run(chunks, failures, scores);
    const auto t1 = Clock::now();
    if (!failures.empty()) throw std::runtime_error("profile: a synthetic step failed: " + failures[0].error);
    return static_cast<double>(std::chrono::duration_cast<std::chrono::nanoseconds>(t1 - t0).count());
  };

  // Warm up (allocator, thread pools, caches) on the largest and a small step.
  const auto largest = std::max_element(
      points.begin(), points.end(), [](const Point& a, const Point& b) { return a.tokens() < b.tokens(); });
  time_once(chunks_of(*largest));
  time_once(chunks_of(grid_point(0, 1, 0, lim)));

  // Each pass times every point once, in a new shuffled order: a point's runs
  // are spread over the whole profile, so a busy spell on a shared machine
  // touches some runs of many points instead of all runs of a few.
  for (Point& p : points)
    for (const Item& it : p.items) p.m.sample.shape.add(it.start, it.n, it.sample);
  std::vector<size_t> order(points.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  size_t done = 0;
  for (int32_t pass = 0; pass < o.reps; ++pass) {
    for (size_t i = order.size(); i > 1; --i)
      std::swap(order[i - 1], order[static_cast<size_t>(rng.uniform_int(0, static_cast<int64_t>(i) - 1))]);
    for (size_t idx : order) {
      points[idx].m.reps_ns.push_back(time_once(chunks_of(points[idx])));
      if (o.progress) o.progress(++done, points.size() * static_cast<size_t>(o.reps));
    }
  }

  sim::CostProfile prof;
  for (Point& p : points) (p.heldout ? prof.heldout_points : prof.fit_points).push_back(std::move(p.m));
  sim::refit(prof, o.stat);

  prof.created = core::utc_now_iso8601();
  prof.device = gpt.device().str();
  prof.dtype = model::to_string(gpt.dtype());
  prof.kv_cache_dtype = model::to_string(o.kv_dtype);
  prof.processor = gpt.device().is_cpu() ? core::cpu_model_name() : gpt.device().str();
  prof.threads = at::get_num_threads();
  prof.thread_summary = model::thread_summary();
  prof.libraries = {{"torch", TORCH_VERSION},
                    {"compiler", __VERSION__},
                    {"troupe_cost_model", std::to_string(sim::CostProfile::kVersion)}};
  prof.model.n_layer = cfg.n_layer;
  prof.model.n_head = cfg.n_head;
  prof.model.n_embd = cfg.n_embd;
  prof.model.n_positions = cfg.n_positions;
  prof.model.vocab_size = cfg.vocab_size;
  prof.model.eos_token_id = cfg.eos_token_id;
  prof.block_size = o.block_size;
  prof.kv_bytes_per_token = model::PagedKvCache::bytes_per_block(cfg, 1, o.kv_dtype);
  prof.sampling = "greedy";
  return prof;
}

}  // namespace troupe::cluster
