// troupe-engine: every command of the command line (cli/command_line.hpp:
// `troupe` runs the clients' commands and simulate itself and hands the rest
// to this binary). Thin: parse flags, call a library, print.
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <stdexcept>
#include <string>

#include <CLI/CLI.hpp>

#include "cli/command.hpp"
#include "cli/command_line.hpp"
#include "core/heap_pages.hpp"
#include "model/cpu_features.hpp"
#include "model/kernel_team.hpp"
#include "model/kv_prefault.hpp"
#include "model/threading.hpp"

namespace {

// Whether `command` may run the model's kernels (OpenMP, OpenBLAS): every
// command but those `troupe` runs itself (cli/command_line.hpp: the clients', simulate),
// a download, and no command at all (--help, --version). Only these pay for
// init_numerics_process's re-execution, whose second load of libtorch was
// half of `troupe status`'s 1.1 s start (Zen 5, 2026-12-07).
bool runs_kernels(const std::string& command) {
  return !(command.empty() || command == "download" || troupe::cli::front_command(command));
}

}  // namespace

int main(int argc, char** argv) {
  const std::string command = troupe::cli::subcommand_of(argc, argv);
  if (command == "simulate")  // (`troupe simulate` runs in the front; here when troupe-engine is run itself)
    troupe::cli::prepare_simulator_process(argv);
  else if (runs_kernels(command))
    troupe::model::init_numerics_process(argc, argv);
  // After the possible re-exec above, so "failpoints active" prints once.
  if (!troupe::cli::configure_failpoints()) return 2;
  // Read again by each worker (its StepExecutor, its first forward pass); refused
  // here, before anything starts.
  try {
    troupe::core::HeapTrimPolicy::min_tokens_from(std::getenv("TROUPE_HEAP_TRIM"));
    troupe::model::kernel_team_enabled();  // TROUPE_KERNEL_TEAM: read by the first forward pass
    troupe::model::kv_prefault_mode();     // TROUPE_KV_PREFAULT: read by each StepExecutor
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "troupe: %s\n", e.what());
    return 2;
  }

  CLI::App app{"troupe: serve GPT-2 from a cluster of actors"};
  app.require_subcommand(1);
  app.set_help_all_flag("--help-all", "Help for every command");
  app.set_version_flag(
      "--version",
      [] { return std::string("troupe ") + TROUPE_VERSION + "\n" + troupe::model::kernel_summary(); },
      "Print the version, the CPU and the kernel variant chosen for it, and exit");
  troupe::model::ThreadOptions threads;
  troupe::cli::add_threads_flag(app, threads.intra_op_threads);

  troupe::cli::Registry registry;
  troupe::cli::add_model_commands(app, registry);
  troupe::cli::add_text_commands(app, registry);
  troupe::cli::add_generate_command(app, registry);
  troupe::cli::add_batch_command(app, registry);
  troupe::cli::add_perplexity_command(app, registry);
  troupe::cli::add_cluster_commands(app, registry);
  troupe::cli::add_key_commands(app, registry);
  troupe::cli::add_submit_commands(app, registry);
  troupe::cli::add_profile_command(app, registry);
  troupe::cli::add_bench_command(app, registry);
  troupe::cli::add_simulate_command(app, registry);
  return troupe::cli::parse_and_run(app, registry, argc, argv, [&threads] {
    troupe::model::configure_threads(threads);
    troupe::model::kernel_isa();  // a bad TROUPE_CPU fails here, before any work
    troupe::model::choose_one_row_prefetch(std::getenv("TROUPE_ONE_ROW_PREFETCH"), false);  // and these
    troupe::model::choose_bf16_dot(std::getenv("TROUPE_BF16_DOT"), false);
  });
}
