#include "cli/command_line.hpp"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <stdexcept>

#include "core/failpoints.hpp"
#include "core/heap_pages.hpp"

namespace troupe::cli {

std::string subcommand_of(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--threads")) {
      ++i;
    } else if (argv[i][0] != '-') {
      return argv[i];
    }
  }
  return "";
}

bool front_command(const std::string& command) {
  for (const char* name : {"submit", "status", "bench", "tokenize", "detokenize", "keygen", "simulate"})
    if (command == name) return true;
  return false;
}

void prepare_simulator_process(char** argv) {
  core::reexec_with_simulator_heap(argv);
  core::tune_malloc();
}

bool configure_failpoints() {
  try {
    fail::configure_from_env();
    return true;
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "troupe: TROUPE_FAILPOINTS: %s\n", e.what());
    return false;
  }
}

void add_threads_flag(CLI::App& app, int& threads) {
  app.add_option("--threads", threads, "Intra-op threads for the model (0 = all CPUs; env TROUPE_THREADS)")
      ->check(non_negative_number());
}

int parse_and_run(CLI::App& app, const Registry& registry, int argc, char** argv,
                  const std::function<void()>& prepare) {
  // The global flags may come after the command too ("troupe serve --threads 1 ...").
  bool known = false;
  const std::string name = subcommand_of(argc, argv);
  for (CLI::App* sub : app.get_subcommands({})) {
    sub->fallthrough();
    known = known || sub->check_name(name);
  }
  if (!name.empty() && !known) {
    std::fprintf(stderr, "troupe: no command '%s' (`troupe --help` lists them)\n", name.c_str());
    return 109;  // CLI11's exit status for arguments it did not expect
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  for (const auto& cmd : registry) {
    if (!cmd.app->parsed()) continue;
    try {
      prepare();
      return cmd.run();
    } catch (const std::invalid_argument& e) {
      std::fprintf(stderr, "troupe %s: error: %s\n", cmd.app->get_name().c_str(), e.what());
      return 2;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "troupe %s: error: %s\n", cmd.app->get_name().c_str(), e.what());
      return 1;
    }
  }
  return 0;
}

int exec_engine(char** argv) {
  std::error_code ec;
  std::filesystem::path dir = std::filesystem::read_symlink("/proc/self/exe", ec).parent_path();
  if (ec) dir = std::filesystem::path(argv[0]).parent_path();  // no /proc: where we were started from
  const std::string engine = (dir / "troupe-engine").string();
  execv(engine.c_str(), argv);
  std::fprintf(stderr, "troupe: cannot start %s (the binary of every command but the clients'): %s\n",
               engine.c_str(), std::strerror(errno));
  return 127;
}

}  // namespace troupe::cli
