// troupe profile: measure a worker's step time and write the cost model the simulator uses.
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>

#include "cli/command.hpp"
#include "cli/model_flags.hpp"
#include "cluster/loadgen/head_profiler.hpp"
#include "cluster/sim/live/cost_profiler.hpp"
#include "cluster/sim/roofline.hpp"
#include "model/gpt2.hpp"
#include "model/model_dir.hpp"
#include "model/threading.hpp"
#include "model/weights.hpp"

namespace troupe::cli {
namespace {

struct ProfileFlags {
  std::string model, preset, out, refit, stat = "min", device = "cpu", calibrate_with, dtype = "float32",
              kv_cache_dtype = "auto", roofline, against;
  CLI::Option* stat_flag = nullptr;
  int threads = 0;
  bool quiet = false;
  cluster::ProfileOptions options;
  bool head = false;  // --head: the head's cost per event, not a worker's step time
  cluster::HeadProfileOptions head_options;
};

void print_error_line(const char* label, const cluster::sim::FitError& e) {
  std::printf("%-34s median %5.1f%%   p90 %5.1f%%   max %6.1f%%   (%zu points)\n", label, e.median_pct,
              e.p90_pct, e.max_pct, e.points);
}

void print_report(const std::string& out, const cluster::sim::CostProfile& p) {
  std::printf("%s: %d layers, %d wide, %d positions on %s (%s), %s; point time = %s of %zu runs\n",
              out.c_str(), p.model.n_layer, p.model.n_embd, p.model.n_positions, p.device.c_str(),
              p.processor.c_str(), p.thread_summary.c_str(), cluster::sim::to_string(p.stat),
              p.fit_points.empty() ? size_t{0} : p.fit_points[0].reps_ns.size());
  print_error_line("fit error (grid):", p.fit_error);
  print_error_line("held-out error (random steps):", p.heldout_error);
  print_error_line("repeatability (even vs odd runs):", p.repeatability);
  if (p.calibration.steps > 0) {
    std::printf(
        "calibrated to %zu served steps (%s): fitted again on the grid's %zu points and them, "
        "scaled to their total time\n",
        p.calibration.steps, p.calibration.source.c_str(), p.fit_points.size());
    print_error_line("served steps, before calibration:", p.calibration.before);
    print_error_line("served steps, after calibration:", p.calibration.after);
    std::printf(
        "(the grid and held-out steps were timed alone; the calibrated model predicts served steps, so "
        "its errors on them above may grow)\n");
    return;
  }
  const bool met = p.heldout_error.median_pct <= 5 && p.heldout_error.p90_pct <= 10;
  std::printf("target on held-out steps: median <= 5%%, p90 <= 10%%: %s\n", met ? "met" : "NOT met");
  if (!met && p.repeatability.median_pct > 5)
    std::printf("(this machine repeats a step's time within %.1f%% (median): quieten it and profile again)\n",
                p.repeatability.median_pct);
}

// --roofline SPEC: a device's published limits as a cost profile (no measuring).
int run_roofline(const ProfileFlags& f) {
  const cluster::sim::RooflineSpec spec = cluster::sim::read_roofline_spec(f.roofline);
  if (!f.against.empty()) {
    // The method against measured steps: a cost profile's points, or a GPU's CSV (bench/gpu/).
    const bool csv = f.against.size() > 4 && f.against.substr(f.against.size() - 4) == ".csv";
    const auto steps = csv ? cluster::sim::measured_steps_csv(f.against)
                           : cluster::sim::measured_steps(cluster::sim::read_cost_profile(f.against));
    std::printf("%s against the steps measured in %s (error = (roofline - measured) / measured):\n",
                spec.name.c_str(), f.against.c_str());
    for (const auto& e : cluster::sim::roofline_errors(spec, steps))
      std::printf("  %-24s %4zu steps: |error| median %6.1f%%, p90 %6.1f%%; signed median %+6.1f%%\n",
                  e.step_class.c_str(), e.points, e.median_pct, e.p90_pct, e.median_signed_pct);
    return 0;
  }
  const model::Gpt2Config cfg =
      f.model.empty() ? model::Gpt2Config::preset(f.preset) : model::Gpt2Config::from_json_file(f.model + "/config.json");
  cluster::sim::ModelShape m;
  m.n_layer = cfg.n_layer;
  m.n_head = cfg.n_head;
  m.n_embd = cfg.n_embd;
  m.n_positions = cfg.n_positions;
  m.vocab_size = cfg.vocab_size;
  m.eos_token_id = cfg.eos_token_id;
  const std::string dtype = model::to_string(model::parse_weight_dtype(f.dtype));
  // auto: the weights' dtype, bfloat16 for the int8 kinds (roofline_kv_dtype).
  const std::string kv_dtype =
      f.kv_cache_dtype == "auto"
          ? cluster::sim::roofline_kv_dtype(dtype)
          : model::to_string(model::parse_kv_cache_dtype(f.kv_cache_dtype, model::parse_weight_dtype(f.dtype)));
  const cluster::sim::CostProfile p =
      cluster::sim::roofline_profile(spec, m, dtype, f.options.block_size, f.options.seed, kv_dtype);
  cluster::sim::write_cost_profile(f.out, p);
  std::printf("%s: %s, GPT-2 of %d layers, %d wide, %s: a PREDICTION from published limits (%s)\n", f.out.c_str(),
              spec.name.c_str(), m.n_layer, m.n_embd, dtype.c_str(), p.thread_summary.c_str());
  print_error_line("fit error (grid) vs the roofline:", p.fit_error);
  print_error_line("held-out error vs the roofline:", p.heldout_error);
  return 0;
}

// --head: a real head with emulated workers, its CPU per event.
int run_head_profile(ProfileFlags& f) {
  if (f.out.empty()) throw std::invalid_argument("--out is required");
  if (f.model.empty()) throw std::invalid_argument("--head needs --model (the head's tokenizer and config)");
  cluster::HeadProfileOptions& o = f.head_options;
  o.troupe = std::filesystem::read_symlink("/proc/self/exe").string();
  o.model = f.model;
  o.max_model_len = model::Gpt2Config::from_json_file(f.model + "/config.json").n_positions;
  if (o.work_dir.empty()) o.work_dir = f.out + ".d";
  if (!f.quiet) o.log = [](const std::string& line) { std::fprintf(stderr, "profile --head: %s\n", line.c_str()); };
  const cluster::sim::HeadProfile p = cluster::profile_head(o);
  cluster::sim::write_head_profile(f.out, p);
  const cluster::sim::HeadCost& c = p.cost;
  std::printf("%s: the head on %s, %s\n", f.out.c_str(), p.processor.c_str(), p.setup.c_str());
  std::printf("per request %.1f us, per step result %.1f us, per token %.1f us; idle %.1f%% of a CPU\n",
              c.request_ns / 1e3, c.step_ns / 1e3, c.token_ns / 1e3, 100 * c.idle_share);
  std::printf("fit error over the %zu runs: median %.1f%%, max %.1f%% (logs in %s)\n", p.runs.size(),
              p.fit_median_pct, p.fit_max_pct, o.work_dir.c_str());
  return 0;
}

int run_profile(ProfileFlags& f) {
  if (f.head) return run_head_profile(f);
  if (!f.head_options.emulate.empty() || f.head_options.pin)
    throw std::invalid_argument("--emulate and --pin measure the head: give --head");
  if (f.out.empty() && f.against.empty()) throw std::invalid_argument("--out is required");
  f.options.stat = cluster::sim::parse_rep_stat(f.stat);
  if (!f.refit.empty()) {
    if (!f.model.empty() || !f.preset.empty())
      throw std::invalid_argument("--refit measures nothing: drop --model/--preset");
    cluster::sim::CostProfile p = cluster::sim::read_cost_profile(f.refit);
    // Calibrating alone keeps the profile's fit; --stat (or no calibration) fits again.
    if (f.calibrate_with.empty() || f.stat_flag->count() > 0) cluster::sim::refit(p, f.options.stat);
    if (!f.calibrate_with.empty())
      cluster::sim::calibrate(p, cluster::sim::read_step_log(f.calibrate_with), f.calibrate_with);
    cluster::sim::write_cost_profile(f.out, p);
    print_report(f.out, p);
    return 0;
  }
  if (!f.calibrate_with.empty()) throw std::invalid_argument("--calibrate-with needs --refit COST.json");
  if (!f.roofline.empty() && !f.against.empty()) return run_roofline(f);  // the steps bring their shapes
  if (f.model.empty() == f.preset.empty())
    throw std::invalid_argument("give --model DIR, or --preset NAME for random weights of a known shape");
  if (!f.roofline.empty()) return run_roofline(f);
  if (!f.against.empty()) throw std::invalid_argument("--against checks a --roofline spec");
  if (f.threads > 0) model::configure_threads({f.threads, 0});
  const c10::Device device = parse_device(f.device);
  f.options.kv_dtype = model::parse_kv_cache_dtype(f.kv_cache_dtype, model::parse_weight_dtype(f.dtype));
  std::optional<model::ModelDir> dir;
  model::Gpt2Config cfg;
  std::unique_ptr<model::Gpt2> gpt;
  if (!f.model.empty()) {
    dir = model::load_model_dir(f.model);
    cfg = dir->config;
    gpt = std::make_unique<model::Gpt2>(cfg, std::move(dir->weights), device, model::parse_weight_dtype(f.dtype));
  } else {
    cfg = model::Gpt2Config::preset(f.preset);  // speed does not depend on the weights' values
    gpt = std::make_unique<model::Gpt2>(cfg, model::Gpt2Weights::random(cfg, 1), device,
                                        model::parse_weight_dtype(f.dtype));
  }
  const bool tty = isatty(STDERR_FILENO);
  if (!f.quiet) {
    f.options.progress = [tty](size_t done, size_t total) {
      if (tty) {
        std::fprintf(stderr, "\rprofiling: %zu/%zu steps", done, total);
        if (done == total) std::fprintf(stderr, "\n");
      } else if (done == total || done % 100 == 0) {
        std::fprintf(stderr, "profiling: %zu/%zu timed steps\n", done, total);
      }
    };
  }
  const cluster::sim::CostProfile p = cluster::profile_worker(*gpt, f.options);
  cluster::sim::write_cost_profile(f.out, p);
  print_report(f.out, p);
  return 0;
}

}  // namespace

void add_profile_command(CLI::App& app, Registry& registry) {
  auto* sub =
      app.add_subcommand("profile", "Measure a worker's step time and fit the simulator's cost model");
  auto f = std::make_shared<ProfileFlags>();
  sub->add_option("--model", f->model, "Model folder");
  sub->add_option("--preset", f->preset,
                  "Instead of --model: random weights of a shape (tiny, gpt2, gpt2-medium, gpt2-large, gpt2-xl)");
  sub->add_option("--out", f->out, "Cost profile to write (JSON; required unless --against)");
  sub->add_option("--device", f->device, "Torch device: cpu, cuda, cuda:N");
  add_dtype_flags(sub, f->dtype);
  add_kv_cache_dtype_flag(sub, f->kv_cache_dtype);
  sub->add_option("--threads", f->threads, "Intra-op threads (0 = troupe's --threads or all CPUs)")
      ->check(non_negative_number());
  sub->add_flag("--quick", f->options.quick, "A small grid (tests: under a minute on the tiny model)");
  sub->add_option("--reps", f->options.reps, "Timed runs per point, summarised by --stat (0 = 5, quick 3)")
      ->check(non_negative_number());
  sub->add_option("--heldout", f->options.heldout, "Random steps held out of the fit (0 = 40, quick 8)")
      ->check(non_negative_number());
  sub->add_option("--block-size", f->options.block_size, "KV block size the scheduler will use")
      ->check(CLI::Range(1, 1024));
  sub->add_option("--kv-tokens", f->options.max_kv_tokens,
                  "KV slots a profiled step may fill (memory: 0 = 32768, quick 4096)")
      ->check(non_negative_number());
  sub->add_option("--max-batched-tokens", f->options.max_batched_tokens,
                  "Largest step measured, in tokens (0 = 2048, quick 256)")
      ->check(non_negative_number());
  sub->add_option("--seed", f->options.seed, "Seed of the tokens and the held-out steps");
  f->stat_flag =
      sub->add_option("--stat", f->stat,
                      "A point's time from its runs: min (the step without interference; default) or median");
  sub->add_option("--refit", f->refit,
                  "Measure nothing: fit this profile's points again (e.g. with another --stat)");
  sub->add_option("--calibrate-with", f->calibrate_with,
                  "With --refit: fit the model again with the served steps of this step log added "
                  "(troupe serve --step-log), so that it predicts steps as served");
  sub->add_option("--roofline", f->roofline,
                  "Measure nothing: predict the profile of a device from its published limits (a spec YAML, "
                  "docs/profiles/specs/) for --model's or --preset's shape, --dtype or --quantization (int8: int8 x "
                  "int8 products at the spec's int8_tops) and --kv-cache-dtype (auto: the weights' dtype, "
                  "bfloat16 for int8)");
  sub->add_option("--against", f->against,
                  "With --roofline: compare it with measured steps (a cost profile's points, or "
                  "bench/gpu/gpt2_steps.py's CSV) per class of step, instead of writing a profile");
  sub->add_flag("--head", f->head,
                "Measure the head instead of a worker: a real head (troupe serve) with emulated workers under "
                "load, its CPU per request, step result and token (the file simulate --head-cost reads)");
  sub->add_option("--emulate", f->head_options.emulate, "With --head: the emulated workers' cost profile");
  sub->add_option("--emulate-time-scale", f->head_options.time_scale,
                  "With --head: the emulated steps take this much of the profile's time")
      ->check(CLI::PositiveNumber);
  sub->add_option("--workers", f->head_options.workers, "With --head: emulated workers (16 a node)")
      ->check(CLI::Range(1, 1024));
  sub->add_option("--seconds", f->head_options.seconds, "With --head: about how long each measured run lasts")
      ->check(CLI::PositiveNumber);
  sub->add_flag("--pin", f->head_options.pin,
                "With --head: the head on a CPU of its own, the emulated workers and the client on the others");
  sub->add_option("--work-dir", f->head_options.work_dir, "With --head: the processes' logs (default: OUT.d)");
  sub->add_flag("--quiet", f->quiet, "No progress on stderr");
  registry.push_back({sub, [f] { return run_profile(*f); }});
}

}  // namespace troupe::cli
