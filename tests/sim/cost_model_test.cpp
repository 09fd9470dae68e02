// The cost model: step shapes from plans, piecewise predictions, a fit that
// recovers a known model, non-negative least squares, and the cost file's
// round trip.
#include "cluster/sim/cost_model.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <sstream>

#include "cluster/sim/cost_profile.hpp"
#include "cluster/sim/least_squares.hpp"
#include "cluster/sim/random.hpp"
#include "core/step_log.hpp"
#include "sim_test_utils.hpp"

namespace troupe::cluster::sim {
namespace {

CostModel known() {
  CostModel m;
  m.knots = {1, 16, 256};
  m.knot_ns = {5e6, 6e6, 30e6};
  m.sample_ns = 2e5;
  m.decode_pair_ns = 300;
  m.prefill_pair_ns = 40;
  m.item_ns = 1e4;
  return m;
}

StepShape shape(std::vector<std::tuple<int32_t, int32_t, bool>> items) {
  StepShape s;
  for (auto [start, n, sample] : items) s.add(start, n, sample);
  return s;
}

TEST(CostModel, ShapeOfAPlan) {
  core::StepPlan p;
  p.work.push_back({1, 100, 1, {}, true});  // decode at context 101
  p.work.push_back({2, 0, 32, {}, false});  // first prompt chunk
  p.work.push_back({3, 32, 16, {}, true});  // last prompt chunk after 32 cached
  const StepShape s = StepShape::of(p);
  EXPECT_EQ(s.tokens, 49);
  EXPECT_EQ(s.items, 3);
  EXPECT_EQ(s.sample_rows, 2);
  EXPECT_EQ(s.decode_pairs, 101);
  EXPECT_EQ(s.prefill_pairs, 32 * 33 / 2 + (16 * 32 + 16 * 17 / 2));
  // Prompt rows scored for prompt_logprobs are LM-head rows too.
  p.work[1].score_rows = 32;
  p.work[2].score_rows = 15;
  EXPECT_EQ(StepShape::of(p).sample_rows, 2 + 32 + 15);
}

TEST(CostModel, PredictsPiecewiseInTokens) {
  const CostModel m = known();
  // One decode at context 1 (start 0): g(1) + sample + 1 pair + item.
  EXPECT_EQ(m.predict_ns(shape({{0, 1, true}})), std::llround(5e6 + 2e5 + 300 + 1e4));
  // 8 tokens in one chunk: g halfway-ish between knots 1 and 16 = 5e6 + 7/15 * 1e6.
  EXPECT_EQ(m.predict_ns(shape({{0, 8, false}})), std::llround(5e6 + 7.0 / 15 * 1e6 + 36 * 40 + 1e4));
  // Past the last knot g follows the last segment: slope 24e6/240 = 1e5 per token.
  EXPECT_EQ(m.predict_ns(shape({{0, 300, false}})),
            std::llround(30e6 + 44 * 1e5 + 300.0 * 301 / 2 * 40 + 1e4));
  EXPECT_EQ(m.predict_ns(StepShape{}), 0);
  core::StepPlan p;
  p.work.push_back({1, 0, 8, {}, false});
  EXPECT_EQ(m.predict_ns(p), m.predict_ns(shape({{0, 8, false}})));
}

TEST(CostModel, ScaledPredictsTheFactorTimesEveryStep) {
  const CostModel m = known();
  const std::vector<StepShape> shapes = {shape({{0, 1, true}}), shape({{0, 8, false}}),
                                         shape({{0, 300, false}, {40, 1, true}, {7, 1, true}}),
                                         shape({{1000, 1, true}, {3, 1, true}, {0, 64, true}})};
  for (double f : {0.5, 1.05, 3.0}) {
    const CostModel s = m.scaled(f);
    for (const StepShape& sh : shapes) {
      const double want = f * static_cast<double>(m.predict_ns(sh));
      // Each prediction rounds to 1 ns once, so the two differ by at most ~1 ns times the factor.
      EXPECT_NEAR(static_cast<double>(s.predict_ns(sh)), want, 0.5 + f * 0.5) << "factor " << f;
    }
    EXPECT_EQ(s.knots, m.knots);  // only times scale, not where the knots lie
  }
  EXPECT_EQ(m.scaled(1).to_json(), m.to_json());
  for (double bad : {0.0, -1.0, std::nan(""), HUGE_VAL})
    EXPECT_THROW(m.scaled(bad), std::invalid_argument) << bad;
  EXPECT_THROW(m.scaled(1e305), std::invalid_argument);  // 3e7 ns x 1e305 overflows to inf: refused
}

TEST(CostModel, FitRecoversAKnownModel) {
  const CostModel truth = known();
  Random rng(3);
  std::vector<CostSample> samples;
  for (int i = 0; i < 200; ++i) {
    StepShape s;
    const auto decodes = rng.uniform_int(0, 40);
    for (int64_t d = 0; d < decodes; ++d) s.add(static_cast<int32_t>(rng.uniform_int(0, 900)), 1, true);
    if (decodes == 0 || rng.uniform() < 0.5)
      s.add(static_cast<int32_t>(rng.uniform_int(0, 64)), static_cast<int32_t>(rng.uniform_int(2, 400)),
            rng.uniform() < 0.5);
    samples.push_back({s, static_cast<double>(truth.predict_ns(s))});
  }
  const CostModel fit = CostModel::fit(truth.knots, samples);
  const FitError e = fit_error(fit, samples);
  EXPECT_LT(e.max_pct, 0.01) << e.median_pct;
  EXPECT_NEAR(fit.decode_pair_ns, truth.decode_pair_ns, truth.decode_pair_ns * 1e-3);
  EXPECT_NEAR(fit.prefill_pair_ns, truth.prefill_pair_ns, truth.prefill_pair_ns * 1e-3);
  EXPECT_NEAR(fit.knot_ns[2], truth.knot_ns[2], truth.knot_ns[2] * 1e-3);
}

TEST(CostModel, FitErrorIsRelative) {
  CostModel m;
  m.knots = {1};
  m.knot_ns = {100};
  std::vector<CostSample> s = {
      {shape({{0, 1, false}}), 100}, {shape({{0, 1, false}}), 80}, {shape({{0, 1, false}}), 125}};
  const FitError e = fit_error(m, s);
  EXPECT_EQ(e.points, 3u);
  EXPECT_NEAR(e.median_pct, 20, 1e-9);  // errors 0, 25, 20 percent
  EXPECT_NEAR(e.max_pct, 25, 1e-9);
  EXPECT_NEAR(e.p90_pct, 24, 1e-9);
}

TEST(CostModel, RejectsBadModels) {
  CostModel m = known();
  m.knots = {16, 1, 256};
  EXPECT_THROW(CostModel::fit(m.knots, {}), std::invalid_argument);
  EXPECT_THROW(CostModel::fit({1, 2}, {}), std::invalid_argument);  // no samples
  nlohmann::json j = known().to_json();
  j["decode_pair_ns"] = -1;
  EXPECT_THROW(CostModel::from_json(j), std::runtime_error);
  j = known().to_json();
  j.erase("knot_ns");
  try {
    CostModel::from_json(j);
    FAIL();
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("knot_ns"), std::string::npos);
  }
}

TEST(LeastSquares, SolvesAndRespectsNonNegativity) {
  // y = 2 + 3x exactly.
  Matrix a;
  std::vector<double> b;
  for (int x = 0; x < 5; ++x) {
    a.push_back({1.0, static_cast<double>(x)});
    b.push_back(2 + 3 * x);
  }
  auto x = least_squares(a, b);
  EXPECT_NEAR(x[0], 2, 1e-9);
  EXPECT_NEAR(x[1], 3, 1e-9);
  // y = 5 - x: the unconstrained slope is -1; with x >= 0 the best is the mean, slope 0.
  for (int i = 0; i < 5; ++i) b[i] = 5 - i;
  x = least_squares(a, b);
  EXPECT_NEAR(x[1], -1, 1e-9);
  x = nonnegative_least_squares(a, b);
  EXPECT_NEAR(x[0], 3, 1e-9);
  EXPECT_EQ(x[1], 0);
  // A duplicated column: rank deficient, still solved.
  Matrix d = {{1, 1}, {2, 2}, {3, 3}};
  x = least_squares(d, {2, 4, 6});
  EXPECT_NEAR(x[0] + x[1], 2, 1e-9);
  EXPECT_THROW(least_squares({{1, 2}, {3}}, {1, 2}), std::invalid_argument);
}

CostProfile profile() {
  CostProfile p;
  p.created = "2025-01-01T00:00:00Z";
  p.device = "cpu";
  p.processor = "Test CPU";
  p.threads = 2;
  p.thread_summary = "torch=2";
  p.libraries = {{"torch", "1.13"}, {"troupe", "0.1.0"}};
  p.model.n_layer = 2;
  p.model.n_positions = 128;
  p.block_size = 16;
  p.kv_bytes_per_token = 1024;
  p.sampling = "greedy";
  p.cost = known();
  MeasuredStep m;
  m.sample = {shape({{0, 12, true}}), 123456.5};
  m.reps_ns = {123000, 123456.5, 130000};
  m.prefill_tokens = 12;
  m.prefill_seqs = 1;
  p.fit_points = {m};
  p.heldout_points = {m, m};
  p.fit_error = {1, 0.5, 0.9, 1.2};
  p.heldout_error = {2, 3.25, 7.5, 8};
  return p;
}

TEST(CostProfile, RoundTripKeepsPredictions) {
  const CostProfile p = profile();
  test::TempFile f("", ".json");
  write_cost_profile(f.path, p);
  const CostProfile q = read_cost_profile(f.path);
  EXPECT_EQ(q.processor, "Test CPU");
  EXPECT_EQ(q.model.n_positions, 128);
  EXPECT_EQ(q.kv_bytes_per_token, 1024);
  EXPECT_EQ(q.libraries, p.libraries);
  ASSERT_EQ(q.heldout_points.size(), 2u);
  EXPECT_EQ(q.heldout_points[1].reps_ns, p.heldout_points[1].reps_ns);
  EXPECT_EQ(q.heldout_error.p90_pct, 7.5);
  EXPECT_EQ(q.cost.knot_ns, p.cost.knot_ns);
  Random rng(1);
  for (int i = 0; i < 100; ++i) {
    const StepShape s = shape({{static_cast<int32_t>(rng.uniform_int(0, 500)),
                                static_cast<int32_t>(rng.uniform_int(1, 600)), rng.uniform() < 0.5}});
    EXPECT_EQ(q.cost.predict_ns(s), p.cost.predict_ns(s));
  }
  // And the text is stable: writing what was read gives the same file.
  test::TempFile g("", ".json");
  write_cost_profile(g.path, q);
  std::ifstream a(f.path), b(g.path);
  std::stringstream sa, sb;
  sa << a.rdbuf();
  sb << b.rdbuf();
  EXPECT_EQ(sa.str(), sb.str());
}

TEST(CostProfile, ShippedProfilesAreGpt2AndTheirErrorsAreTheirPointsErrors) {
  // Every example in docs/profiles: GPT-2 124M on a named processor, a
  // grid's fit, and the held-out error it states is the error of its model
  // on its held-out points (a hand-edited or stale file fails).
  size_t n = 0;
  for (const auto& e : std::filesystem::directory_iterator(TROUPE_PROFILES_DIR)) {
    if (e.path().extension() != ".json") continue;
    SCOPED_TRACE(e.path().string());
    ++n;
    const CostProfile p = read_cost_profile(e.path().string());
    EXPECT_FALSE(p.processor.empty());
    EXPECT_EQ(p.model.n_layer, 12);
    EXPECT_EQ(p.model.n_embd, 768);
    EXPECT_EQ(p.model.vocab_size, 50257);
    EXPECT_EQ(p.calibration.steps, 0u);
    ASSERT_GE(p.heldout_points.size(), 10u);
    std::vector<CostSample> held;
    for (const MeasuredStep& m : p.heldout_points) held.push_back(m.sample);
    const FitError err = fit_error(p.cost, held);
    EXPECT_NEAR(err.median_pct, p.heldout_error.median_pct, 0.01);
    EXPECT_NEAR(err.p90_pct, p.heldout_error.p90_pct, 0.01);
    // One decode token costs more than nothing and less than a 2048-token prefill.
    const int64_t one = p.cost.predict_ns(shape({{0, 1, true}}));
    EXPECT_GT(one, 1000000);
    EXPECT_LT(one, p.cost.predict_ns(shape({{0, 2048, true}})));
  }
  EXPECT_GE(n, 2u);
}

TEST(CostProfile, RefitChoosesTheStatisticAndFitsAgain) {
  // Points made from a known model, each with one slow run (interference):
  // the minimum recovers the model, the median nearly so.
  const CostModel truth = known();
  CostProfile p = profile();
  p.fit_points.clear();
  p.heldout_points.clear();
  Random rng(8);
  for (int i = 0; i < 120; ++i) {
    MeasuredStep m;
    const auto d = rng.uniform_int(0, 30);
    for (int64_t k = 0; k < d; ++k)
      m.sample.shape.add(static_cast<int32_t>(rng.uniform_int(0, 900)), 1, true);
    if (d == 0 || rng.uniform() < 0.6)
      m.sample.shape.add(0, static_cast<int32_t>(rng.uniform_int(2, 256)), true);
    const double t = static_cast<double>(truth.predict_ns(m.sample.shape));
    m.reps_ns = {t * 1.01, t, t * 3, t * 1.02};
    (i % 4 == 0 ? p.heldout_points : p.fit_points).push_back(m);
  }
  refit(p, RepStat::kMin);
  EXPECT_EQ(p.stat, RepStat::kMin);
  EXPECT_EQ(p.fit_points[0].sample.ns, p.fit_points[0].reps_ns[1]);
  EXPECT_LT(p.heldout_error.max_pct, 0.01);
  EXPECT_EQ(p.heldout_error.points, 30u);
  // Even runs {1.01t, 3t} against odd runs {t, 1.02t}: minima 1.01t and t, 1% apart.
  EXPECT_EQ(p.repeatability.points, 120u);
  EXPECT_NEAR(p.repeatability.median_pct, 1.0, 1e-6);
  int64_t largest = 0;
  for (const auto& m : p.fit_points) largest = std::max(largest, m.sample.shape.tokens);
  for (const auto& m : p.heldout_points) largest = std::max(largest, m.sample.shape.tokens);
  EXPECT_EQ(p.cost.knots.back(), largest);  // the largest step measured
  refit(p, RepStat::kMedian);               // every time 1.015x: so is the model
  EXPECT_NEAR(p.fit_points[0].sample.ns, p.fit_points[0].reps_ns[1] * 1.015,
              1e-6 * p.fit_points[0].sample.ns);
  const StepShape s = p.heldout_points[3].sample.shape;
  EXPECT_NEAR(p.cost.predict_ns(s), 1.015 * truth.predict_ns(s), 1e-3 * truth.predict_ns(s));
  EXPECT_EQ(to_string(parse_rep_stat("median")), std::string("median"));
  EXPECT_THROW(parse_rep_stat("mean"), std::invalid_argument);
  p.fit_points.clear();
  EXPECT_THROW(refit(p, RepStat::kMin), std::invalid_argument);
}

TEST(CostProfile, BadFilesSayWhatIsWrong) {
  auto expect = [](const std::string& text, const std::string& what) {
    test::TempFile f(text, ".json");
    try {
      read_cost_profile(f.path);
      ADD_FAILURE() << "accepted " << text.substr(0, 60);
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(f.path), std::string::npos) << e.what();
    }
  };
  expect("{", "not JSON");
  expect("{\"format\": \"something\"}", "troupe-cost-profile");
  auto j = profile().to_json();
  j["version"] = 99;
  expect(j.dump(), "version 99");
  j = profile().to_json();
  j.erase("kv_bytes_per_token");
  expect(j.dump(), "kv_bytes_per_token");
  j = profile().to_json();
  j["model"]["n_layer"] = "two";
  expect(j.dump(), "n_layer");
  EXPECT_THROW(read_cost_profile("/nonexistent/cost.json"), std::runtime_error);
}

// A step log written by core::StepLog (what `troupe serve --step-log`
// writes) reads back as the shapes planned and the times the workers took.
TEST(StepLog, WritesEachFinishedStepAndReadsBackAsSamples) {
  auto text = std::make_shared<std::ostringstream>();
  core::StepLog log(text);
  core::StepPlan a;
  a.step_id = 7;
  a.work.push_back({11, 100, 1, {}, true});
  a.work.push_back({12, 0, 32, {3, 4}, false});
  core::StepPlan b = a;
  b.step_id = 8;
  core::StepPlan empty;  // nothing to run: never logged
  empty.step_id = 9;
  log.planned(1, a);
  log.planned(2, a);  // the same step id on another worker is another step
  log.planned(1, b);
  log.planned(1, empty);
  EXPECT_EQ(log.pending(), 3u);
  core::StepResult r;
  r.step_id = 7;
  r.forward_ms = 12.5;
  r.idle_ms = 0.25;
  log.done(2, r);
  core::StepResult failed;
  failed.step_id = 8;
  failed.error = "out of memory";
  log.done(1, failed);  // failed steps took no honest time: not written
  core::StepResult stray;
  stray.step_id = 42;
  log.done(1, stray);  // never planned: ignored
  log.forget(1);       // worker 1 is gone: its step 7 never comes back
  EXPECT_EQ(log.pending(), 0u);
  r.forward_ms = 99;
  log.done(1, r);
  EXPECT_EQ(text->str(),
            "{\"worker\":2,\"step\":7,\"items\":[[100,1,1],[0,32,0]],\"ms\":12.5000,\"idle_ms\":0.2500}\n");

  test::TempFile f(text->str() + "\n" + text->str(), ".jsonl");  // a blank line is skipped
  const std::vector<CostSample> s = read_step_log(f.path);
  ASSERT_EQ(s.size(), 2u);
  EXPECT_EQ(s[1].ns, 12.5e6);
  EXPECT_EQ(s[0].shape.tokens, 33);
  EXPECT_EQ(s[0].shape.sample_rows, 1);
  EXPECT_EQ(s[0].shape.decode_pairs, 101);
  EXPECT_EQ(s[0].shape.prefill_pairs, 32 * 33 / 2);

  EXPECT_EQ(core::StepLog::to_file("/nonexistent/steps.jsonl"), nullptr);
  test::TempFile g("stale line\n", ".jsonl");
  {
    auto file_log = core::StepLog::to_file(g.path);
    ASSERT_NE(file_log, nullptr);
    file_log->planned(2, a);
    r.forward_ms = 12.5;
    file_log->done(2, r);
  }
  EXPECT_EQ(read_step_log(g.path).size(), 1u) << "the file is emptied first";
}

TEST(StepLog, MalformedLinesNameTheFileAndLine) {
  const std::string good = "{\"items\":[[0,4,1]],\"ms\":1.5}\n";
  auto expect = [&](const std::string& bad, const std::string& what) {
    test::TempFile f(good + bad + "\n" + good, ".jsonl");
    try {
      read_step_log(f.path);
      ADD_FAILURE() << "accepted " << bad;
    } catch (const std::runtime_error& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find(f.path + " line 2: "), std::string::npos) << m;
      EXPECT_NE(m.find(what), std::string::npos) << m;
    }
  };
  expect("{\"items\":[[0,4,1]],\"ms\":", "not a JSON object");
  expect("[1,2]", "not a JSON object");
  expect("{\"items\":[],\"ms\":1}", "\"items\"");
  expect("{\"items\":[[0,4,1]],\"ms\":0}", "\"ms\"");
  expect("{\"items\":[[0,4,1]],\"ms\":\"fast\"}", "\"ms\"");
  expect("{\"items\":[[0,0,1]],\"ms\":1}", "num_tokens >= 1");
  expect("{\"items\":[[-1,4,1]],\"ms\":1}", "start_pos >= 0");
  expect("{\"items\":[[0,4]],\"ms\":1}", "each item");
  expect("{\"items\":[[0,99999999999,1]],\"ms\":1}", "each item");
  EXPECT_THROW(read_step_log("/nonexistent/steps.jsonl"), std::runtime_error);
}

// Served steps whose time differs from the grid's by kind, as measured
// (decode-only steps faster in succession, steps with a prompt slower):
// calibration fits them, keeps the grid's steps where no served step is, a
// second calibration starts from the grid, and a refit clears it.
TEST(CostProfile, CalibrationFitsServedStepsAndKeepsTheGrid) {
  CostModel truth;
  truth.knots = {1, 4, 16, 64, 256};
  truth.knot_ns = {5e6, 5.2e6, 6e6, 12e6, 30e6};
  truth.sample_ns = 2e5;
  truth.decode_pair_ns = 300;
  truth.prefill_pair_ns = 40;
  truth.item_ns = 1e4;
  CostProfile p = profile();
  p.fit_points.clear();
  p.stat = RepStat::kMedian;
  auto point = [&](const StepShape& sh) {
    MeasuredStep m;
    m.sample.shape = sh;
    const double t = static_cast<double>(truth.predict_ns(sh));
    m.reps_ns = {t, 1.01 * t, 0.99 * t};
    return m;
  };
  for (int32_t b : {1, 2, 4, 8, 16, 32})
    for (int32_t ctx : {32, 128}) {
      std::vector<std::tuple<int32_t, int32_t, bool>> items(b, {ctx, 1, true});
      p.fit_points.push_back(point(shape(items)));
    }
  for (int32_t n : {16, 32, 64, 128, 256}) {
    p.fit_points.push_back(point(shape({{0, n, true}})));
    p.fit_points.push_back(point(shape({{0, n, true}, {50, 1, true}, {80, 1, true}})));
  }
  p.heldout_points = {point(shape({{0, 200, true}}))};
  refit(p, RepStat::kMedian);
  const CostModel grid = p.cost;
  ASSERT_LT(p.fit_error.max_pct, 1.5);

  std::vector<CostSample> served;
  Random rng(3);
  for (int i = 0; i < 300; ++i) {
    CostSample c;
    const bool prompt = i % 5 == 0;
    if (prompt) c.shape.add(0, static_cast<int32_t>(rng.uniform_int(64, 256)), true);
    for (int64_t d = rng.uniform_int(prompt ? 0 : 1, prompt ? 4 : 16); d > 0; --d)
      c.shape.add(static_cast<int32_t>(rng.uniform_int(20, 400)), 1, true);
    c.ns = (prompt ? 1.25 : 0.8) * static_cast<double>(truth.predict_ns(c.shape));
    served.push_back(c);
  }
  calibrate(p, served, "steps.jsonl");
  EXPECT_EQ(p.calibration.steps, 300u);
  EXPECT_EQ(p.calibration.source, "steps.jsonl");
  EXPECT_GT(p.calibration.before.median_pct, 15);
  EXPECT_LT(p.calibration.after.median_pct, 6);
  const StepShape decode = shape({{100, 1, true}, {200, 1, true}, {300, 1, true}, {150, 1, true}});
  const StepShape prompt = shape({{0, 150, true}, {60, 1, true}});
  EXPECT_NEAR(p.cost.predict_ns(decode) / (0.8 * truth.predict_ns(decode)), 1.0, 0.06);
  EXPECT_NEAR(p.cost.predict_ns(prompt) / (1.25 * truth.predict_ns(prompt)), 1.0, 0.06);
  // No served step has 32 sequences: the grid decides there.
  std::vector<std::tuple<int32_t, int32_t, bool>> wide(32, {128, 1, true});
  EXPECT_NEAR(p.cost.predict_ns(shape(wide)) / static_cast<double>(truth.predict_ns(shape(wide))), 1.0, 0.15);
  EXPECT_GT(p.fit_error.median_pct, 1.5) << "the profile's errors follow the calibrated model";

  test::TempFile f("", ".json");
  write_cost_profile(f.path, p);
  const CostProfile q = read_cost_profile(f.path);
  EXPECT_EQ(q.cost.predict_ns(prompt), p.cost.predict_ns(prompt));
  EXPECT_EQ(q.calibration.source, "steps.jsonl");
  EXPECT_EQ(q.calibration.steps, 300u);
  EXPECT_EQ(q.calibration.after.max_pct, p.calibration.after.max_pct);

  // Calibrating again measures against the grid's fit, not the calibrated one.
  for (CostSample& c : served) c.ns = static_cast<double>(truth.predict_ns(c.shape));
  calibrate(p, served, "as-profiled.jsonl");
  EXPECT_LT(p.calibration.before.max_pct, 1.5);
  EXPECT_NEAR(p.cost.predict_ns(decode) / static_cast<double>(grid.predict_ns(decode)), 1.0, 0.02);

  refit(p, RepStat::kMedian);
  EXPECT_EQ(p.calibration.steps, 0u);
  EXPECT_EQ(p.cost.predict_ns(prompt), grid.predict_ns(prompt));

  // A profile written by hand (no measured points): the served steps alone.
  CostProfile hand = profile();
  hand.fit_points.clear();
  hand.heldout_points.clear();
  hand.cost = truth;
  for (CostSample& c : served) c.ns = 2.0 * static_cast<double>(truth.predict_ns(c.shape));
  calibrate(hand, served, "doubled.jsonl");
  EXPECT_GT(hand.calibration.before.median_pct, 45);
  EXPECT_LT(hand.calibration.after.max_pct, 2);
  EXPECT_NEAR(hand.cost.predict_ns(decode) / (2.0 * truth.predict_ns(decode)), 1.0, 0.02);

  // A slow tail (every fifth step 1.6x): the fit follows the typical step,
  // the scale makes the total the served total.
  for (size_t i = 0; i < served.size(); ++i)
    served[i].ns = (i % 5 == 3 ? 1.6 : 1.0) * static_cast<double>(truth.predict_ns(served[i].shape));
  calibrate(hand, served, "tail.jsonl");
  double total = 0, predicted = 0;
  for (const CostSample& c : served) {
    total += c.ns;
    predicted += static_cast<double>(hand.cost.predict_ns(c.shape));
  }
  EXPECT_NEAR(predicted / total, 1.0, 1e-4);
  EXPECT_GT(hand.cost.predict_ns(decode), 1.05 * truth.predict_ns(decode)) << "above the typical step";
  EXPECT_FALSE(p.to_json().contains("served_calibration"));
  served.resize(9);
  EXPECT_THROW(calibrate(p, served, "few"), std::invalid_argument);
  served.resize(10, served[0]);
  served[3].ns = 0;
  EXPECT_THROW(calibrate(p, served, "zero"), std::invalid_argument);
}

}  // namespace
}  // namespace troupe::cluster::sim
