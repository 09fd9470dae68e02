// Black-box tests of the `troupe` binary: real processes, real files, exit
// codes and messages a user sees.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <thread>

#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "cluster/loadgen/child_process.hpp"
#include "core/heap_pages.hpp"
#include "jsonl.hpp"
#include "test_utils.hpp"

using nlohmann::json;
using troupe::test::CommandResult;
using troupe::test::run_command;
using troupe::test::shell_quote;
using troupe::test::TempDir;

namespace {

std::string tcmd(const std::string& args) { return shell_quote(troupe::test::troupe_bin()) + " " + args; }

// A tiny random model made once per test process through the CLI itself.
const std::string& tiny_model() {
  static TempDir dir;
  static std::string path = [] {
    std::string p = dir.file("tiny");
    auto r = run_command(tcmd("init-model --preset tiny --seed 7 --out " + shell_quote(p) + " --tokenizer " +
                                shell_quote(troupe::test::tokenizer_dir())));
    if (r.status != 0) throw std::runtime_error("init-model failed: " + r.output);
    return p;
  }();
  return path;
}

std::string model_flag() { return "--model " + shell_quote(tiny_model()); }

json run_json(const std::string& args) {
  auto r = run_command(tcmd(args), /*merge_stderr=*/false);
  EXPECT_EQ(r.status, 0) << args << "\n" << r.output;
  return json::parse(r.output);
}

using troupe::test::read_jsonl;

// A running process's /proc/PID/<file>, whole ("" when it has gone).
std::string proc_file(pid_t pid, const char* file) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/" + file, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

}  // namespace

TEST(Cli, HelpOnEveryCommand) {
  for (const char* cmd : {"", "init-model", "convert", "download", "tokenize", "detokenize", "generate",
                          "batch", "perplexity"}) {
    auto r = run_command(tcmd(std::string(cmd) + " --help"));
    EXPECT_EQ(r.status, 0) << cmd;
    EXPECT_NE(r.output.find("Usage"), std::string::npos) << cmd << r.output;
  }
  // --help-all (troupe-engine's) after a command that troupe runs itself too.
  for (const char* cmd : {"", "tokenize", "simulate", "status"}) {
    auto r = run_command(tcmd(std::string(cmd) + " --help-all"));
    EXPECT_EQ(r.status, 0) << cmd << ": " << r.output;
    EXPECT_NE(r.output.find("Usage"), std::string::npos) << cmd << r.output;
  }
}

// `troupe` runs the clients' commands without libtorch (cli/command_line.hpp)
// and becomes troupe-engine for the others, which alone re-execute
// themselves to set OMP_WAIT_POLICY before libgomp loads. Each command runs
// until it connects to a socket of this test; its memory map and environment
// then say which binary it is and whether its final exec set the variable.
TEST(Cli, ClientsStartWithoutLibtorchAndOnlyKernelCommandsReexecuteForOpenMp) {
  struct Seen {
    std::string environ, maps;
  };
  const auto seen_in_command = [](const std::vector<std::string>& command_args, const std::string& log) {
    const int server = socket(AF_INET, SOCK_STREAM, 0);
    EXPECT_GE(server, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof addr;
    EXPECT_EQ(bind(server, reinterpret_cast<sockaddr*>(&addr), len), 0);
    EXPECT_EQ(listen(server, 4), 0);
    EXPECT_EQ(getsockname(server, reinterpret_cast<sockaddr*>(&addr), &len), 0);
    const std::string endpoint = "tcp://127.0.0.1:" + std::to_string(ntohs(addr.sin_port));
    std::vector<std::string> args{
        "env", "-u", "OMP_WAIT_POLICY", "-u", "GOMP_SPINCOUNT", troupe::test::troupe_bin()};
    for (const std::string& a : command_args) args.push_back(a == "ENDPOINT" ? endpoint : a);
    troupe::cluster::ChildProcess child(args, log);
    pollfd pfd{server, POLLIN, 0};
    const bool connected = poll(&pfd, 1, 60000) == 1;
    Seen seen;
    if (connected) {
      seen.environ = proc_file(child.pid(), "environ");
      seen.maps = proc_file(child.pid(), "maps");
    }
    close(server);
    EXPECT_TRUE(connected) << "no connection from " << command_args[0];
    return seen;
  };
  TempDir dir;
  const Seen client =
      seen_in_command({"status", "--to", "ENDPOINT", "--timeout", "60"}, dir.file("status.log"));
  EXPECT_EQ(client.environ.find("OMP_WAIT_POLICY="), std::string::npos) << "troupe status re-executed itself";
  EXPECT_EQ(client.maps.find("libtorch"), std::string::npos) << "troupe status loaded libtorch";
  EXPECT_EQ(client.maps.find("troupe-engine"), std::string::npos) << "troupe status ran in troupe-engine";
  const Seen worker = seen_in_command(
      {"worker", "--join", "ENDPOINT", "--model", tiny_model(), "--workers", "1", "--join-timeout", "60"},
      dir.file("worker.log"));
  EXPECT_NE(worker.environ.find(std::string("OMP_WAIT_POLICY=PASSIVE") + '\0'), std::string::npos)
      << "troupe worker did not re-execute itself with OMP_WAIT_POLICY set";
  EXPECT_NE(worker.maps.find("troupe-engine"), std::string::npos) << "troupe worker is not troupe-engine";
  EXPECT_NE(worker.maps.find("libtorch_cpu"), std::string::npos) << "troupe worker without libtorch?";
}

// `troupe simulate` runs in the front, without libtorch, on the simulator's
// heap (cli::prepare_simulator_process: the process re-executes itself once
// with its allocator's variable set). A run long enough to be read while it
// works: its /proc environ, once it shows the variable, is the final exec's,
// and its memory map then says which binary and which malloc run it.
TEST(Cli, SimulateRunsInTheFrontOnTheSimulatorsHeap) {
  // The front's malloc is mimalloc's (linked; not in a sanitizer build), which the
  // re-exec asks for huge pages where the kernel gives them; else glibc's, with its tunables.
  const bool mimalloc = TROUPE_FRONT_MIMALLOC;
  const bool huge = troupe::core::kernel_allows_huge_pages();
  const std::string marker = mimalloc ? "MIMALLOC_LARGE_OS_PAGES=1" : "glibc.malloc.tcache_count=1024";
  TempDir dir;
  troupe::cluster::ChildProcess child(
      {"env", "-u", "GLIBC_TUNABLES", "-u", "MIMALLOC_LARGE_OS_PAGES", "-u", "TROUPE_HEAP_THP",
       troupe::test::troupe_bin(), "simulate", "--cost",
       std::string(TROUPE_TEST_DIR) + "/../docs/profiles/gpt2-124m-cpu-epyc-2threads.json", "--request-rate",
       "50", "--num-requests", "1000000"},
      dir.file("simulate.log"));
  std::string environ, maps;
  const bool reexec = !mimalloc || huge;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (child.running() && std::chrono::steady_clock::now() < until) {
    environ = proc_file(child.pid(), "environ");
    maps = proc_file(child.pid(), "maps");  // after environ: the libraries of the same exec, or a later one's
    if ((!reexec || environ.find(marker) != std::string::npos) &&
        (!mimalloc || maps.find("libmimalloc") != std::string::npos) &&
        maps.find("libzmq") != std::string::npos)
      break;  // its libraries loaded (libzmq: every troupe's)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  if (reexec) {
    EXPECT_NE(environ.find(marker), std::string::npos)
        << "troupe simulate did not re-execute itself with the simulator's heap: " << child.log();
  }
  EXPECT_EQ(maps.find("libmimalloc") != std::string::npos, mimalloc) << maps;
  if (mimalloc) {
    EXPECT_EQ(environ.find("GLIBC_TUNABLES="), std::string::npos) << "glibc's malloc serves nothing";
  }
  EXPECT_EQ(maps.find("libtorch"), std::string::npos) << "troupe simulate loaded libtorch";
  EXPECT_EQ(maps.find("troupe-engine"), std::string::npos) << "troupe simulate ran in troupe-engine";
  EXPECT_TRUE(child.running()) << "read after the run ended: " << child.log();
}

// Without troupe-engine beside it, troupe still runs the clients' commands and
// simulate, and says plainly why it cannot run the others.
TEST(Cli, AFrontWithoutItsEngineRunsTheClientsAndSaysWhyNotTheRest) {
  TempDir dir;
  const std::string front = dir.file("troupe");
  std::filesystem::copy_file(troupe::test::troupe_bin(), front);
  std::filesystem::permissions(front, std::filesystem::perms::owner_all);
  auto tok = run_command(shell_quote(front) + " tokenize " + model_flag() + " hi", false);
  EXPECT_EQ(tok.status, 0) << tok.output;
  EXPECT_EQ(tok.output, "[5303]\n");
  auto gen = run_command(shell_quote(front) + " generate " + model_flag() + " --prompt-ids 1 --max-tokens 1");
  EXPECT_EQ(gen.status, 127) << gen.output;
  EXPECT_NE(gen.output.find("cannot start " + dir.file("troupe-engine")), std::string::npos) << gen.output;
  // The simulator runs in the front too (torch-free), its report byte for byte troupe-engine's
  // (which runs it on glibc's malloc, the front on mimalloc's).
  const std::string sim =
      " simulate --cost " +
      shell_quote(std::string(TROUPE_TEST_DIR) + "/../docs/profiles/gpt2-124m-cpu-epyc-2threads.json") +
      " --request-rate 5 --num-requests 40 --seed 3";
  auto alone = run_command(shell_quote(front) + sim, false);
  EXPECT_EQ(alone.status, 0) << alone.output;
  EXPECT_NE(alone.output.find("Successful requests:                     40"), std::string::npos)
      << alone.output;
  auto engine = run_command(shell_quote(troupe::test::troupe_engine_bin()) + sim, false);
  EXPECT_EQ(engine.status, 0) << engine.output;
  EXPECT_EQ(alone.output, engine.output);
}

TEST(Cli, BadFlagsAndCommandsAreNamedPlainly) {
  for (const auto& [flag, message] : std::vector<std::pair<std::string, std::string>>{
           {"--max-tokens 0", "--max-tokens: must be > 0, got 0"},
           {"--max-tokens abc", "--max-tokens: must be a number, got 'abc'"},
           {"--temperature inf", "--temperature: must be a number, got 'inf'"},
           {"--temperature -1", "--temperature: must be >= 0, got -1"}}) {
    auto r = run_command(tcmd("submit --to tcp://127.0.0.1:1 --prompt hi " + flag));
    EXPECT_NE(r.status, 0) << flag;
    EXPECT_NE(r.output.find(message), std::string::npos) << flag << ": " << r.output;
    EXPECT_LT(r.output.size(), 300u) << "no 300-digit range: " << r.output;
  }
  auto unknown = run_command(tcmd("nosuchcmd --x 1"));
  EXPECT_NE(unknown.status, 0);
  EXPECT_NE(unknown.output.find("no command 'nosuchcmd'"), std::string::npos) << unknown.output;
  // The global --threads after the command as well as before it.
  auto after = run_command(tcmd("tokenize " + model_flag() + " --threads 1 hi"), false);
  EXPECT_EQ(after.status, 0) << after.output;
  EXPECT_EQ(after.output, "[5303]\n");
}

// A bad TROUPE_HEAP_TRIM stops troupe before it starts anything (a worker
// would otherwise die on it later); a good one runs.
TEST(Cli, BadHeapTrimSettingStopsTheProcessAtStart) {
  for (const char* bad : {"abc", "-1", ""}) {
    auto r = run_command("env TROUPE_HEAP_TRIM=" + shell_quote(bad) + " " +
                         tcmd("serve " + model_flag() + " --workers 1 --listen tcp://127.0.0.1:0"));
    EXPECT_EQ(r.status, 2) << bad << ": " << r.output;
    EXPECT_NE(r.output.find("TROUPE_HEAP_TRIM must be a count of tokens"), std::string::npos) << r.output;
    EXPECT_EQ(r.output.find("serving"), std::string::npos) << "nothing started: " << r.output;
  }
  auto ok = run_command("env TROUPE_HEAP_TRIM=0 " +
                        tcmd("generate " + model_flag() + " --prompt-ids 1,2,3 --max-tokens 2 --mode paged"));
  EXPECT_EQ(ok.status, 0) << ok.output;
}

// A 0-or-1 setting read from the environment: a bad value stops troupe
// before it starts anything (exit 2, naming it); 0 and 1 run, with the same
// tokens either way.
static void expect_switch_checked_at_start(const std::string& var, const std::string& bad_value) {
  auto bad = run_command("env " + var + "=" + bad_value + " " +
                         tcmd("serve " + model_flag() + " --workers 1 --listen tcp://127.0.0.1:0"));
  EXPECT_EQ(bad.status, 2) << bad.output;
  EXPECT_NE(bad.output.find(var + " must be 0"), std::string::npos) << bad.output;
  EXPECT_EQ(bad.output.find("serving"), std::string::npos) << "nothing started: " << bad.output;
  std::string tokens[2];
  for (int on = 0; on < 2; ++on) {
    auto ok =
        run_command("env " + var + "=" + std::to_string(on) + " " +
                        tcmd("generate " + model_flag() + " --prompt-ids 1,2,3 --max-tokens 4 --mode paged"),
                    /*merge_stderr=*/false);
    EXPECT_EQ(ok.status, 0) << ok.output;
    tokens[on] = ok.output;
  }
  EXPECT_EQ(tokens[0], tokens[1]);
}

// TROUPE_KERNEL_TEAM (model/kernel_team.hpp).
TEST(Cli, BadKernelTeamSettingStopsTheProcessAtStart) {
  expect_switch_checked_at_start("TROUPE_KERNEL_TEAM", "2");
}

// TROUPE_KV_PREFAULT (model/kv_prefault.hpp).
TEST(Cli, BadKvPrefaultSettingStopsTheProcessAtStart) {
  expect_switch_checked_at_start("TROUPE_KV_PREFAULT", "yes");
}

TEST(Cli, InitModelWritesACompleteFolderAndWarns) {
  TempDir dir;
  auto r = run_command(tcmd("init-model --preset tiny --layers 1 --out " + shell_quote(dir.file("m")) +
                              " --tokenizer " + shell_quote(troupe::test::tokenizer_dir())));
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("RANDOM"), std::string::npos);
  for (const char* f : {"config.json", "model.safetensors", "vocab.json", "merges.txt"}) {
    std::ifstream in(dir.file("m/") + f);
    EXPECT_TRUE(in.good()) << f;
  }
  std::ifstream cfg(dir.file("m/config.json"));
  json c = json::parse(cfg);
  EXPECT_EQ(c["n_layer"], 1);
  EXPECT_EQ(c["troupe_random_weights"], true);
}

// troupe convert writes a folder that --dtype bfloat16 loads as the model
// the original folder gives it (the same tokens), from half the bytes; it
// will not write over a model.
TEST(Cli, ConvertWritesABfloat16FolderThatGeneratesTheSameTokens) {
  TempDir dir;
  const std::string out = dir.file("bf16");
  auto r = run_command(tcmd("convert " + model_flag() + " --out " + shell_quote(out)));
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("matrices in bfloat16"), std::string::npos) << r.output;
  EXPECT_LT(std::filesystem::file_size(out + "/model.safetensors"),
            std::filesystem::file_size(tiny_model() + "/model.safetensors") * 6 / 10);
  const std::string gen =
      " --prompt-ids 11,22,33,44 --max-tokens 12 --mode paged --ignore-eos --dtype bfloat16 --json";
  const json a = run_json("generate " + model_flag() + gen);
  const json b = run_json("generate --model " + shell_quote(out) + gen);
  EXPECT_EQ(a["ids"], b["ids"]);
  EXPECT_EQ(a["ids"].size(), 12u);
  EXPECT_EQ(
      run_json("generate --model " + shell_quote(out) + " --prompt-ids 11,22 --max-tokens 3 --json")["ids"]
          .size(),
      3u)
      << "float32 from a BF16 file";
  auto again = run_command(tcmd("convert " + model_flag() + " --out " + shell_quote(out)));
  EXPECT_NE(again.status, 0);
  EXPECT_NE(again.output.find("already holds config.json"), std::string::npos) << again.output;
  auto bad =
      run_command(tcmd("convert " + model_flag() + " --out " + shell_quote(dir.file("x")) + " --dtype int8"));
  EXPECT_NE(bad.status, 0);
  EXPECT_FALSE(std::filesystem::exists(dir.file("x")));
}

TEST(Cli, InitModelRejectsBadShape) {
  TempDir dir;
  auto r = run_command(tcmd("init-model --preset tiny --heads 3 --out " + shell_quote(dir.file("m"))));
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.output.find("error"), std::string::npos) << r.output;
}

TEST(Cli, TokenizePrintsIds) {
  auto ids = run_json("tokenize " + model_flag() + " 'Hello world'");
  EXPECT_EQ(ids, json::parse("[15496, 995]"));
}

TEST(Cli, TokenizeRejectsInvalidUtf8) {
  auto r = run_command(tcmd("tokenize " + model_flag() + " $(printf 'ab\\377c')"));
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_NE(r.output.find("UTF-8"), std::string::npos) << r.output;
}

TEST(Cli, TokenizeAndDetokenizeJsonlRoundTrip) {
  TempDir dir;
  {
    std::ofstream in(dir.file("in.jsonl"));
    in << R"({"text": "Hello world"})" << "\n"
       << R"({"text": "naïve café 東京 🙂"})" << "\n"
       << "not json\n"
       << R"({"txt": 1})" << "\n";
  }
  auto r = run_command(tcmd("tokenize --jsonl " + model_flag() + " < " + shell_quote(dir.file("in.jsonl")) + " > " +
                              shell_quote(dir.file("ids.jsonl"))));
  EXPECT_NE(r.status, 0) << "bad lines make the exit status non-zero";
  auto lines = read_jsonl(dir.file("ids.jsonl"));
  ASSERT_EQ(lines.size(), 4u);
  EXPECT_EQ(lines[0]["ids"], json::parse("[15496, 995]"));
  EXPECT_TRUE(lines[2].contains("error"));
  EXPECT_TRUE(lines[3].contains("error"));
  {
    std::ofstream ids(dir.file("ids2.jsonl"));
    ids << lines[0].dump() << "\n" << lines[1].dump() << "\n";
  }
  r = run_command(tcmd("detokenize --jsonl " + model_flag() + " < " + shell_quote(dir.file("ids2.jsonl")) + " > " +
                         shell_quote(dir.file("text.jsonl"))));
  ASSERT_EQ(r.status, 0) << r.output;
  auto texts = read_jsonl(dir.file("text.jsonl"));
  ASSERT_EQ(texts.size(), 2u);
  EXPECT_EQ(texts[0]["text"], "Hello world");
  EXPECT_EQ(texts[1]["text"], "naïve café 東京 🙂");
}

TEST(Cli, GenerateJsonHasEveryField) {
  auto j = run_json("generate " + model_flag() +
                    " --prompt 'Hello world' --max-tokens 5 --ignore-eos --logprobs 3 --json");
  EXPECT_EQ(j["prompt_ids"], json::parse("[15496, 995]"));
  ASSERT_EQ(j["ids"].size(), 5u);
  EXPECT_EQ(j["finish_reason"], "length");
  EXPECT_TRUE(j["text"].is_string());
  ASSERT_EQ(j["logprobs"].size(), 5u);
  for (size_t i = 0; i < 5; ++i) {
    EXPECT_EQ(j["logprobs"][i]["id"], j["ids"][i]);
    EXPECT_LE(j["logprobs"][i]["logprob"].get<double>(), 0.0);
    EXPECT_EQ(j["logprobs"][i]["top"].size(), 3u);
  }
  for (const char* k : {"prefill_ms", "decode_ms", "tokens_per_s"}) EXPECT_TRUE(j["timing"][k].is_number()) << k;
  for (const char* k : {"cpu", "kernels"}) EXPECT_TRUE(j["timing"][k].is_string()) << k;
}

TEST(Cli, GenerateModesAgreeAndSeedsReproduce) {
  std::string base = "generate " + model_flag() + " --prompt-ids 464,1893,286 --max-tokens 12 --ignore-eos --json";
  auto naive = run_json(base + " --mode naive");
  auto kv = run_json(base + " --mode kv");
  auto paged = run_json(base + " --mode paged");
  EXPECT_EQ(naive["ids"], kv["ids"]);
  EXPECT_EQ(naive["ids"], paged["ids"]);
  // The paged loop over a bfloat16 KV cache runs (its tokens may differ: another model).
  EXPECT_EQ(run_json(base + " --mode paged --kv-cache-dtype bfloat16")["ids"].size(), 12u);
  std::string sampled = base + " --temperature 1.0 --top-p 0.9 --seed 42";
  auto a = run_json(sampled + " --mode kv");
  auto b = run_json(sampled + " --mode paged");
  auto c = run_json(base + " --temperature 1.0 --top-p 0.9 --seed 43 --mode kv");
  EXPECT_EQ(a["ids"], b["ids"]);
  EXPECT_NE(a["ids"], c["ids"]);
}

// The logit flags give the same tokens in every loop (each feeds the sampler
// the tokens generated so far its own way), and change them.
TEST(Cli, GenerateLogitFlagsAgreeAcrossModes) {
  const std::string base =
      "generate " + model_flag() + " --prompt-ids 464,1893,286 --max-tokens 16 --ignore-eos --json";
  for (const std::string flags :
       {" --presence-penalty 2", " --frequency-penalty 1.5 --logit-bias 11=3", " --repetition-penalty 3",
        " --temperature 1 --seed 3 --logit-bias 11=9 --frequency-penalty 2"}) {
    auto naive = run_json(base + flags + " --mode naive");
    auto kv = run_json(base + flags + " --mode kv");
    auto paged = run_json(base + flags + " --mode paged");
    EXPECT_EQ(naive["ids"], kv["ids"]) << flags;
    EXPECT_EQ(kv["ids"], paged["ids"]) << flags;
    const std::string plain =
        flags.find("--temperature") == std::string::npos ? "" : " --temperature 1 --seed 3";
    EXPECT_NE(kv["ids"], run_json(base + plain + " --mode kv")["ids"]) << flags;
  }
  auto forced = run_json(base + " --logit-bias 11=100 --mode paged");
  EXPECT_EQ(forced["ids"], json(std::vector<int>(16, 11)));
}

TEST(Cli, GenerateCompareReportsSameTokens) {
  auto r = run_command(tcmd("generate --compare " + model_flag() + " --prompt 'The actor' --max-tokens 8"));
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("naive"), std::string::npos);
  EXPECT_NE(r.output.find("paged"), std::string::npos);
  EXPECT_NE(r.output.find("same tokens in every mode: yes"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("RANDOM"), std::string::npos) << "random weights must be announced";
}

TEST(Cli, GenerateStreamsTextAndTiming) {
  auto r = run_command(tcmd("generate " + model_flag() + " --prompt 'Hi' --max-tokens 4 --ignore-eos"));
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("ms/token"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("tokens/s"), std::string::npos) << r.output;
}

TEST(Cli, GenerateErrorsExitNonZeroWithMessage) {
  struct Case {
    std::string args, needle;
  };
  TempDir empty;
  std::vector<Case> cases = {
      {"generate --model " + shell_quote(empty.file("nope")) + " --prompt hi", "nope"},
      {"generate " + model_flag() + " --prompt hi --max-tokens 500", "positions"},
      {"generate " + model_flag() + " --prompt hi --temperature -1", "temperature"},
      {"generate " + model_flag() + " --prompt hi --top-p 0", "top_p"},
      {"generate " + model_flag() + " --prompt hi --top-p 1.5", "top-p"},
      {"generate " + model_flag() + " --prompt hi --mode turbo", "mode"},
      {"generate " + model_flag() + " --prompt hi --max-tokens 0", "max-tokens"},
      {"generate " + model_flag() + " --prompt-ids 1,x,3", "x"},
      {"generate " + model_flag() + " --prompt-ids 99999999", "vocabulary"},
      {"generate " + model_flag(), "--prompt"},
      {"generate " + model_flag() + " --prompt hi --device tpu:0", "device"},
      {"generate " + model_flag() + " --prompt hi --presence-penalty 3", "presence-penalty"},
      {"generate " + model_flag() + " --prompt hi --repetition-penalty 0", "repetition_penalty"},
      {"generate " + model_flag() + " --prompt hi --logit-bias 11", "ID=BIAS"},
      {"generate " + model_flag() + " --prompt hi --logit-bias 11=x", "ID=BIAS"},
      {"generate " + model_flag() + " --prompt hi --logit-bias 11=101", "[-100, 100]"},
      {"generate " + model_flag() + " --prompt hi --logit-bias 11=1 --logit-bias 11=2", "twice"},
      {"generate " + model_flag() + " --prompt hi --logit-bias 50257=1", "vocabulary"},
      {"generate " + model_flag() + " --prompt hi --kv-cache-dtype bfloat16", "--mode paged"},
      {"generate " + model_flag() + " --prompt hi --mode paged --kv-cache-dtype fp8", "kv-cache-dtype"},
  };
  for (const auto& c : cases) {
    auto r = run_command(tcmd(c.args));
    EXPECT_NE(r.status, 0) << c.args;
    EXPECT_LT(r.status, 128) << "crashed: " << c.args << "\n" << r.output;
    EXPECT_NE(r.output.find(c.needle), std::string::npos) << c.args << "\n" << r.output;
  }
}

TEST(Cli, BatchRunsGoodLinesAndReportsBadOnesInOrder) {
  TempDir dir;
  {
    std::ofstream in(dir.file("jobs.jsonl"));
    in << R"({"id": "a", "prompt": "Hello world", "max_tokens": 6, "temperature": 0, "ignore_eos": true})" << "\n"
       << "{broken json\n"
       << R"({"id": 3, "prompt_ids": [464, 1893], "max_tokens": 4, "temperature": 0.8, "seed": 5, "logprobs": 2, "ignore_eos": true})"
       << "\n"
       << R"({"id": "long", "prompt_ids": [1, 2, 3], "max_tokens": 1000})" << "\n"
       << R"({"id": "typo", "prompt": "x", "max_token": 3})" << "\n"
       << R"({"id": "bad-top-p", "prompt": "x", "top_p": 0})" << "\n"
       << R"({"id": "a2", "prompt": "Hello world", "max_tokens": 6, "temperature": 0, "ignore_eos": true})" << "\n";
  }
  auto r = run_command(tcmd("batch " + model_flag() + " --input " + shell_quote(dir.file("jobs.jsonl")) +
                              " --output " + shell_quote(dir.file("out.jsonl")) + " --num-blocks 64"));
  ASSERT_EQ(r.status, 1) << "some jobs failed (each line says which)\n" << r.output;
  EXPECT_NE(r.output.find("requests: 7 (3 ok, 4 failed)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("prefix cache"), std::string::npos);
  auto out = read_jsonl(dir.file("out.jsonl"));
  ASSERT_EQ(out.size(), 7u);
  EXPECT_EQ(out[0]["id"], "a");
  EXPECT_EQ(out[0]["ids"].size(), 6u);
  EXPECT_EQ(out[0]["finish_reason"], "length");
  EXPECT_EQ(out[0]["usage"]["prompt_tokens"], 2);
  EXPECT_EQ(out[0]["usage"]["completion_tokens"], 6);
  EXPECT_TRUE(out[1].contains("error"));
  EXPECT_EQ(out[2]["id"], 3);
  EXPECT_EQ(out[2]["ids"].size(), 4u);
  EXPECT_EQ(out[2]["logprobs"].size(), 4u);
  EXPECT_EQ(out[3]["id"], "long");
  EXPECT_TRUE(out[3].contains("error"));
  EXPECT_TRUE(out[4]["error"].get<std::string>().find("max_token") != std::string::npos) << out[4];
  EXPECT_TRUE(out[5].contains("error"));
  EXPECT_EQ(out[6]["ids"], out[0]["ids"]) << "greedy: the same prompt gives the same tokens";
}

TEST(Cli, BatchEchoesAndScoresPrompts) {
  TempDir dir;
  {
    std::ofstream in(dir.file("jobs.jsonl"));
    in << R"({"id": "score", "prompt": "Hello world, said the", "echo": true, "logprobs": 1, "max_tokens": 0})" << "\n"
       << R"({"id": "vllm", "prompt_ids": [15496, 995, 11], "prompt_logprobs": 2, "max_tokens": 2, "temperature": 0, "ignore_eos": true})"
       << "\n"
       << R"({"id": "zero", "prompt": "x", "max_tokens": 0})" << "\n"
       << R"({"id": "echo", "prompt": "Hi", "echo": true, "max_tokens": 1, "temperature": 0, "ignore_eos": true})" << "\n";
  }
  auto r = run_command(tcmd("batch " + model_flag() + " --input " + shell_quote(dir.file("jobs.jsonl")) +
                            " --output " + shell_quote(dir.file("out.jsonl")) + " --num-blocks 64 --max-batched-tokens 4"));
  ASSERT_EQ(r.status, 1) << "the max_tokens 0 line without echo fails\n" << r.output;
  auto out = read_jsonl(dir.file("out.jsonl"));
  ASSERT_EQ(out.size(), 4u);
  const json& a = out[0];
  EXPECT_EQ(a["text"], "Hello world, said the");
  EXPECT_EQ(a["finish_reason"], "length");
  EXPECT_EQ(a["ids"], json::array());
  const size_t n = a["prompt_ids"].size();
  ASSERT_GE(n, 5u);
  ASSERT_EQ(a["logprobs"].size(), n) << a;
  EXPECT_TRUE(a["logprobs"][0]["logprob"].is_null());
  for (size_t i = 1; i < n; ++i) {
    EXPECT_LT(a["logprobs"][i]["logprob"].get<double>(), 0.0);
    EXPECT_EQ(a["logprobs"][i]["id"], a["prompt_ids"][i]);
    EXPECT_EQ(a["logprobs"][i]["top"].size(), 1u);
  }
  const json& v = out[1];
  EXPECT_EQ(v["ids"].size(), 2u);
  ASSERT_EQ(v["prompt_logprobs"].size(), 3u);
  EXPECT_TRUE(v["prompt_logprobs"][0].is_null());
  EXPECT_EQ(v["prompt_logprobs"][1]["id"], 995);
  EXPECT_EQ(v["prompt_logprobs"][2]["id"], 11);
  EXPECT_GE(v["prompt_logprobs"][2]["rank"].get<int>(), 1);
  EXPECT_EQ(v["prompt_logprobs"][2]["top"].size(), 2u);
  EXPECT_FALSE(v.contains("prompt_ids")) << "no echo";
  EXPECT_NE(out[2]["error"].get<std::string>().find("max_tokens"), std::string::npos) << out[2];
  EXPECT_EQ(out[3]["text"].get<std::string>().rfind("Hi", 0), 0u) << out[3];
  EXPECT_FALSE(out[3].contains("logprobs"));
}

// A number past a double's range makes the line unreadable JSON (nlohmann
// throws out_of_range): its error still names the field and the number, and
// the rest of the file runs.
TEST(Cli, BatchNamesTheFieldOfANumberPastADouble) {
  TempDir dir;
  {
    std::ofstream in(dir.file("jobs.jsonl"));
    in << R"({"id": 1, "prompt": "Hello", "max_tokens": 2, "temperature": 1e999})" << "\n"
       << R"({"id": 2, "prompt": "Hello", "max_tokens": 2, "logit_bias": {"11": -1e400}})" << "\n"
       << R"({"id": 3, "prompt": "Hello", "max_tokens": 2, "temperature": 0})" << "\n";
  }
  auto r = run_command(tcmd("batch " + model_flag() + " --input " + shell_quote(dir.file("jobs.jsonl")) +
                              " --output " + shell_quote(dir.file("out.jsonl")) + " --num-blocks 64"));
  EXPECT_EQ(r.status, 1) << r.output;
  auto out = read_jsonl(dir.file("out.jsonl"));
  ASSERT_EQ(out.size(), 3u);
  EXPECT_EQ(out[0]["error"], "temperature: the number 1e999 is out of range (not a finite double)");
  EXPECT_EQ(out[1]["error"], "logit_bias.11: the number -1e400 is out of range (not a finite double)");
  EXPECT_EQ(out[2]["ids"].size(), 2u);
}

// Numbers out of their field's range fail their own line, naming the field and
// the value: never narrowed into range (2^32 + 1 max_tokens is not 1 token).
TEST(Cli, BatchRejectsOutOfRangeNumbersPerLine) {
  struct Case {
    const char* id;
    const char* fields;  // JSON members after the prompt
    const char* field;   // the name the error must quote
    const char* value;   // and (part of) the value it must show
  } cases[] = {
      {"top_k-2^40", R"("top_k": 1099511627776)", "top_k", "1099511627776"},
      {"top_k-neg", R"("top_k": -1)", "top_k", "-1"},
      {"top_k-float", R"("top_k": 2.5)", "top_k", "2.5"},
      {"priority--2^40", R"("priority": -1099511627776)", "priority", "-1099511627776"},
      {"priority-2^31", R"("priority": 2147483648)", "priority", "2147483648"},
      {"seed--1", R"("seed": -1)", "seed", "-1"},
      {"seed-2^70", R"("seed": 1180591620717411303424)", "seed", "1.1805916207174113e+21"},
      {"logprobs-1e10", R"("logprobs": 10000000000)", "logprobs", "10000000000"},
      {"logprobs-21", R"("logprobs": 21)", "logprobs", "21"},
      {"max_tokens-2^32+1", R"("max_tokens": 4294967297)", "max_tokens", "4294967297"},
      {"max_tokens-0", R"("max_tokens": 0)", "max_tokens", "0"},
      {"max_tokens-string", R"("max_tokens": "3")", "max_tokens", "\"3\""},
      {"temperature-1e39", R"("temperature": 1e39)", "temperature", "1e+39"},
      {"temperature-neg", R"("temperature": -0.5)", "temperature", "-0.5"},
      {"top_p-1.5", R"("top_p": 1.5)", "top_p", "1.5"},
      {"top_p-string", R"("top_p": "0.9")", "top_p", "\"0.9\""},
      {"presence-3", R"("presence_penalty": 3)", "presence_penalty", "3"},
      {"frequency-string", R"("frequency_penalty": "1")", "frequency_penalty", "\"1\""},
      {"bias-101", R"("logit_bias": {"5": 101})", "logit_bias", "101"},
      {"bias-key", R"("logit_bias": {"x": 1})", "logit_bias", "\"x\""},
      {"bias-list", R"("logit_bias": [[5, 1]])", "logit_bias", "[[5,1]]"},
      {"repetition-0", R"("repetition_penalty": 0)", "repetition_penalty", "0"},
  };
  TempDir dir;
  {
    std::ofstream in(dir.file("jobs.jsonl"));
    for (const auto& c : cases)
      in << R"({"id": ")" << c.id << R"(", "prompt": "Hello", "max_tokens": 2, )" << c.fields << "}\n";
    // Every field at the edge of its range is accepted.
    in << R"({"id": "edges", "prompt_ids": [464], "max_tokens": 2, "top_k": 2147483647, "priority": -2147483648, )"
       << R"("seed": 18446744073709551615, "logprobs": 20, "temperature": 3.4e38, "top_p": 1, "ignore_eos": true, )"
       << R"("presence_penalty": -2, "frequency_penalty": 2, "logit_bias": {"0": -100, "50256": 100}, )"
       << R"("repetition_penalty": 10})"
       << "\n";
  }
  auto r = run_command(tcmd("batch " + model_flag() + " --input " + shell_quote(dir.file("jobs.jsonl")) +
                            " --output " + shell_quote(dir.file("out.jsonl")) + " --num-blocks 16 --quiet"));
  ASSERT_EQ(r.status, 1) << r.output;
  auto out = read_jsonl(dir.file("out.jsonl"));
  ASSERT_EQ(out.size(), std::size(cases) + 1);
  for (size_t i = 0; i < std::size(cases); ++i) {
    const Case& c = cases[i];
    EXPECT_EQ(out[i]["id"], c.id);
    ASSERT_TRUE(out[i].contains("error")) << out[i];
    const std::string e = out[i]["error"];
    EXPECT_NE(e.find(std::string("\"") + c.field + "\""), std::string::npos) << c.id << ": " << e;
    EXPECT_NE(e.find("got "), std::string::npos) << c.id << ": " << e;
    EXPECT_NE(e.find(c.value, e.find("got ")), std::string::npos) << c.id << ": " << e;
  }
  EXPECT_EQ(out.back()["id"], "edges");
  EXPECT_FALSE(out.back().contains("error")) << out.back();
  EXPECT_EQ(out.back()["ids"].size(), 2u);
  EXPECT_EQ(out.back()["logprobs"][0]["top"].size(), 20u);
}

TEST(Cli, BatchRejectsMissingInput) {
  TempDir dir;
  auto r = run_command(tcmd("batch " + model_flag() + " --input " + shell_quote(dir.file("none.jsonl")) +
                              " --output " + shell_quote(dir.file("out.jsonl"))));
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.output.find("none.jsonl"), std::string::npos) << r.output;
}

TEST(Cli, DownloadFailsFastWithoutNetwork) {
  TempDir dir;
  // Download.UnreachableEndpointFailsFastWithManualSteps checks the failure
  // is quick; here: the command's exit status and message.
  auto r = run_command("TROUPE_HF_ENDPOINT=http://127.0.0.1:9 " +
                       tcmd("download gpt2 --to " + shell_quote(dir.file("gpt2"))));
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.output.find("init-model"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("model.safetensors"), std::string::npos) << r.output;
}

// troupe perplexity on the tiny model: the JSON's fields agree with each
// other and with the windows, the chunk size changes nothing, llama.cpp's
// convention scores fewer tokens, and bad input is named.
TEST(Cli, PerplexityJsonIsConsistentAndIndependentOfTheChunkSize) {
  TempDir dir;
  const std::string text = dir.file("text.txt");
  {
    std::ofstream out(text);
    for (int i = 0; i < 40; ++i) out << "Line " << i << ": the quick brown fox jumps over the lazy dog.\n";
  }
  const std::string base = "perplexity " + model_flag() + " --file " + shell_quote(text) + " --json";
  const json a = run_json(base + " --context 64 --stride 32 --batch 7");
  const json b = run_json(base + " --context 64 --stride 32 --batch 64");
  const int64_t n = a["text_tokens"].get<int64_t>();
  ASSERT_GT(n, 128);
  EXPECT_EQ(a["tokens_scored"].get<int64_t>(), n - 1) << "overlapping windows score every token once";
  EXPECT_NEAR(a["ppl"].get<double>(), std::exp(a["mean_nll"].get<double>()), 1e-9 * a["ppl"].get<double>());
  EXPECT_NEAR(a["mean_nll"].get<double>() * n - a["mean_nll"].get<double>(), a["nll"].get<double>(),
              1e-6 * a["nll"].get<double>());
  EXPECT_NEAR(a["ppl"].get<double>(), b["ppl"].get<double>(), 1e-5 * a["ppl"].get<double>());
  EXPECT_EQ(a["windows_convention"], "sliding");
  EXPECT_TRUE(a["random_weights"].get<bool>());
  for (const char* k : {"tokens_per_s", "scored_per_s", "seconds"}) EXPECT_GT(a[k].get<double>(), 0.0) << k;
  const json half = run_json(base + " --context 64 --score-second-half");
  EXPECT_EQ(half["windows_convention"], "second_half");
  EXPECT_EQ(half["windows"].get<int64_t>(), n / 64);
  EXPECT_EQ(half["tokens_scored"].get<int64_t>(), (n / 64) * (64 - 64 / 2 - 1));

  // bfloat16 weights: their own perplexity, and --kl-divergence against float32.
  const json bf = run_json(base + " --context 64 --stride 32 --dtype bfloat16");
  EXPECT_NE(bf["ppl"].get<double>(), a["ppl"].get<double>()) << "rounded weights are another model";
  EXPECT_NEAR(bf["ppl"].get<double>(), a["ppl"].get<double>(), 0.02 * a["ppl"].get<double>());
  const json kl = run_json(base + " --context 64 --stride 32 --dtype bfloat16 --kl-divergence");
  EXPECT_EQ(kl["dtype"], "bfloat16");
  EXPECT_GT(kl["kl_mean"].get<double>(), 0.0);
  EXPECT_LT(kl["kl_mean"].get<double>(), 0.01);
  EXPECT_GE(kl["kl_p99"].get<double>(), kl["kl_mean"].get<double>());
  EXPECT_GE(kl["kl_max"].get<double>(), kl["kl_p99"].get<double>());
  EXPECT_GT(kl["top1_agreement"].get<double>(), 0.8);
  EXPECT_EQ(kl["tokens_scored"], a["tokens_scored"]);
  EXPECT_NEAR(kl["ppl_float32"].get<double>(), a["ppl"].get<double>(), 1e-6 * a["ppl"].get<double>());
  EXPECT_NEAR(kl["ppl"].get<double>(), bf["ppl"].get<double>(), 1e-6 * bf["ppl"].get<double>());

  EXPECT_EQ(kl["kv_cache_dtype"], "bfloat16") << "auto: the weights' dtype";
  // A bfloat16 KV cache alone, and bfloat16 weights over a float32 one.
  const json kv = run_json(base + " --context 64 --stride 32 --kv-cache-dtype bfloat16 --kl-divergence");
  EXPECT_EQ(kv["dtype"], "float32");
  EXPECT_EQ(kv["kv_cache_dtype"], "bfloat16");
  EXPECT_GT(kv["kl_mean"].get<double>(), 0.0);
  EXPECT_LT(kv["kl_mean"].get<double>(), 0.01);
  EXPECT_GT(kv["top1_agreement"].get<double>(), 0.8);
  const json w16 = run_json(base + " --context 64 --stride 32 --dtype bf16 --kv-cache-dtype float32 --kl-divergence");
  EXPECT_EQ(w16["kv_cache_dtype"], "float32");
  EXPECT_NE(w16["kl_mean"].get<double>(), kl["kl_mean"].get<double>());

  // int8 weights (--quantization int8) likewise; "none" is float32; with --dtype bfloat16 a usage error.
  const json q8 = run_json(base + " --context 64 --stride 32 --quantization int8");
  EXPECT_NE(q8["ppl"].get<double>(), a["ppl"].get<double>()) << "quantized weights are another model";
  EXPECT_NEAR(q8["ppl"].get<double>(), a["ppl"].get<double>(), 0.05 * a["ppl"].get<double>());
  const json kl8 = run_json(base + " --context 64 --stride 32 --quantization int8 --kl-divergence");
  EXPECT_EQ(kl8["dtype"], "int8");
  EXPECT_GT(kl8["kl_mean"].get<double>(), 0.0);
  EXPECT_LT(kl8["kl_mean"].get<double>(), 0.05);
  EXPECT_GE(kl8["kl_p99"].get<double>(), kl8["kl_mean"].get<double>());
  EXPECT_GT(kl8["top1_agreement"].get<double>(), 0.5);
  EXPECT_NEAR(kl8["ppl"].get<double>(), q8["ppl"].get<double>(), 1e-6 * q8["ppl"].get<double>());
  const json g32 = run_json(base + " --context 64 --stride 32 --quantization int8_g32 --kl-divergence");
  EXPECT_EQ(g32["dtype"], "int8_g32");
  EXPECT_GT(g32["kl_mean"].get<double>(), 0.0);
  EXPECT_LT(g32["kl_mean"].get<double>(), 0.05);
  EXPECT_NE(g32["ppl"].get<double>(), q8["ppl"].get<double>()) << "groups of 32 are another quantization";
  const json none = run_json(base + " --context 64 --stride 32 --quantization none");
  EXPECT_NEAR(none["ppl"].get<double>(), a["ppl"].get<double>(), 1e-5 * a["ppl"].get<double>());
  const json fp_q8 = run_json(base + " --context 64 --stride 32 --dtype float32 --quantization int8");
  EXPECT_NEAR(fp_q8["ppl"].get<double>(), q8["ppl"].get<double>(), 1e-6 * q8["ppl"].get<double>());
  auto r = run_command(tcmd(base + " --dtype bfloat16 --quantization int8"));
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.output.find("int8 weights widen to fp32, not to --dtype bfloat16"), std::string::npos) << r.output;
  r = run_command(tcmd(base + " --quantization int4"));
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.output.find("--quantization"), std::string::npos) << r.output;

  r = run_command(tcmd("perplexity " + model_flag() + " --file " + shell_quote(text) + " --kl-divergence"));
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.output.find("give --dtype bfloat16, --quantization int8 or --kv-cache-dtype bfloat16"), std::string::npos)
      << r.output;
  r = run_command(tcmd("perplexity " + model_flag() + " --file " + shell_quote(text) + " --context 4096"));
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.output.find("--context 4096 is past the model's 128 positions"), std::string::npos) << r.output;
  r = run_command(tcmd("perplexity " + model_flag() + " --file " + shell_quote(dir.file("missing.txt"))));
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.output.find("cannot read it"), std::string::npos) << r.output;
  r = run_command(tcmd("perplexity " + model_flag() + " --file " + shell_quote(text) + " --context 64 --stride 65"));
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.output.find("--stride must be in [1, context 64]"), std::string::npos) << r.output;
}
