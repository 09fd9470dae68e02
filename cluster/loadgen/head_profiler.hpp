#pragma once
// `troupe profile --head`: what a real head costs per event. Starts a head
// (`troupe serve --workers 0`) and nodes of emulated workers (`troupe worker
// --emulate`: the whole protocol, steps that take a cost model's time, no
// model) on loopback, loads them with the load generator in this process at
// several mixes of requests, steps and tokens (and once with no traffic),
// reads the head process's CPU time (/proc) and what it served (its status)
// over each run, and fits the head's cost per event (cluster/sim/head_cost.hpp).
#include <cstdint>
#include <functional>
#include <string>

#include "cluster/sim/head_cost.hpp"

namespace troupe::cluster {

struct HeadProfileOptions {
  std::string troupe;        // the troupe binary that runs the head and the nodes
  std::string model;         // model folder: the head's tokenizer and config
  std::string emulate;       // the emulated workers' cost profile (troupe profile --out)
  double time_scale = 0.1;   // their steps this much of the profile's (0.1: 10x faster, GPU-class)
  int32_t workers = 8;       // emulated workers, at most 16 a node
  int32_t num_blocks = 2048; // KV blocks each
  int32_t input_len = 64;    // prompt tokens (random ids, +-50%)
  int32_t max_model_len = 0; // the model's context: prompts and outputs are shortened to fit; 0 = no limit
  double seconds = 4;        // about how long each run lasts
  // The head on the last usable CPU, the nodes and this process (the client)
  // on the others: the head is then one CPU's work, as the simulator models it.
  bool pin = false;
  std::string work_dir;      // the processes' logs and ready file (created)
  std::function<void(const std::string&)> log;  // progress lines; may be unset
};

// Throws std::invalid_argument for bad options, std::runtime_error when the
// cluster does not start or a run fails (naming the log to read).
sim::HeadProfile profile_head(const HeadProfileOptions& options);

}  // namespace troupe::cluster
