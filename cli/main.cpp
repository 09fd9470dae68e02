// troupe: the command line. Thin: parse flags, call a library, print.
#include <CLI/CLI.hpp>

int main(int argc, char** argv) {
  CLI::App app{"troupe: serve GPT-2 from a cluster of actors"};
  app.require_subcommand(1);
  CLI11_PARSE(app, argc, argv);
  return 0;
}
