// troupe: the command line's front (cli/command_line.hpp). The clients'
// commands and simulate run here, in a binary without libtorch; every other
// command is troupe-engine's, which this process becomes.
#include <algorithm>
#include <cstring>
#include <string>

#include <CLI/CLI.hpp>

#include "cli/command.hpp"
#include "cli/command_line.hpp"

int main(int argc, char** argv) {
  const std::string command = troupe::cli::subcommand_of(argc, argv);
  // --help-all is the help of every command: troupe-engine's.
  const bool help_all =
      std::any_of(argv + 1, argv + argc, [](const char* a) { return std::strcmp(a, "--help-all") == 0; });
  if (!troupe::cli::front_command(command) || help_all) return troupe::cli::exec_engine(argv);
  if (command == "simulate") troupe::cli::prepare_simulator_process(argv);
  if (!troupe::cli::configure_failpoints()) return 2;
  CLI::App app{"troupe: serve GPT-2 from a cluster of actors"};
  app.require_subcommand(1);
  int threads = 0;  // accepted as troupe-engine accepts it; these commands run no model
  troupe::cli::add_threads_flag(app, threads);
  troupe::cli::Registry registry;
  troupe::cli::add_text_commands(app, registry);
  troupe::cli::add_key_commands(app, registry);
  troupe::cli::add_submit_commands(app, registry);
  troupe::cli::add_bench_command(app, registry);
  troupe::cli::add_simulate_command(app, registry);
  return troupe::cli::parse_and_run(app, registry, argc, argv, [] {});
}
