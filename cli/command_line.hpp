#pragma once
// What both of troupe's binaries do with a command line: find the command,
// tell the clients' commands from the others, parse and run.
//
// `troupe` (cli/front/main.cpp) runs the clients' commands and simulate itself:
// they talk to a head or a server, run the tokenizer, make keys or simulate a
// cluster, and never load the model, so that binary is linked without
// libtorch (`status` starts in 0.02-0.03 s instead of 0.7-0.8 on Zen 5:
// libtorch's libraries and their static initialisers). Every other command,
// --help and --version it hands to `troupe-engine` beside it (cli/main.cpp),
// which has every command; the process execs it, keeping its pid, arguments
// and environment.
#include <functional>
#include <string>

#include "cli/command.hpp"

namespace troupe::cli {

// The command named on the command line, before CLI11 parses it: the first
// argument that is neither an option nor the value of --threads (the one
// global option that takes a value); "" when there is none.
std::string subcommand_of(int argc, char** argv);

// Whether `command` is one that `troupe` runs itself, without libtorch: the
// clients' (submit, status, bench, tokenize, detokenize, keygen) and simulate
// (the simulator is torch-free: a run of a fraction of a second no longer
// waits ~1 s for libtorch, loaded twice across its heap's re-exec).
bool front_command(const std::string& command);

// Before anything else in a process that runs `simulate`: its state is many
// small allocations visited in turn, so its heap goes on transparent huge
// pages (core/heap_pages.hpp: mimalloc's where it is linked, as in `troupe`;
// glibc's with a deeper tcache, and keeping what it frees, elsewhere). The
// allocator reads that once, at start: the process re-executes itself once.
void prepare_simulator_process(char** argv);

// Arms the failpoints TROUPE_FAILPOINTS names (core/failpoints.hpp); false,
// having said why, when it names them badly (the caller exits 2).
bool configure_failpoints();

// The global --threads flag (both binaries accept it before or after the command).
void add_threads_flag(CLI::App& app, int& threads);

// Parses the command line with the registered commands and runs the one
// named: `prepare` first, then the command. Its exit status; 2 for a bad
// argument (std::invalid_argument), 1 for any other error, CLI11's for a
// parse error, 109 for an unknown command.
int parse_and_run(CLI::App& app, const Registry& registry, int argc, char** argv,
                  const std::function<void()>& prepare);

// Becomes troupe-engine, beside this binary, with the same arguments;
// returns (127) only when that fails, having said why.
int exec_engine(char** argv);

}  // namespace troupe::cli
