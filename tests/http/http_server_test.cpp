// Black-box tests of `troupe serve --http` with clients nobody here wrote:
// curl (plain and streaming), the official openai npm package, promtool on
// /metrics; errors, keys, seeds, and a client that leaves mid-stream.
#include <gtest/gtest.h>

#include <httplib.h>

#include <chrono>
#include <filesystem>
#include <set>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include <torch/types.h>

#include "model/gpt2.hpp"
#include "model/model_dir.hpp"
#include "model/text/tokenizer.hpp"
#include "serve_process.hpp"

using nlohmann::json;
using troupe::test::run_command;
using troupe::test::ServeProcess;
using troupe::test::shell_quote;
using troupe::test::tiny_http_model_dir;
namespace model = troupe::model;

namespace {

struct HttpReply {
  int status = 0;
  std::string body;
};

// curl with a JSON body (or none: GET); status from -w.
HttpReply curl(const std::string& url, const std::string& body = "", const std::string& extra = "") {
  std::string cmd = "curl -sS -N --max-time 120 " + extra + " -w '\\n%{http_code}' ";
  if (!body.empty()) cmd += "-H 'Content-Type: application/json' --data-binary " + shell_quote(body) + " ";
  auto r = run_command(cmd + shell_quote(url), /*merge_stderr=*/false);
  HttpReply h;
  const size_t nl = r.output.rfind('\n');
  if (nl == std::string::npos) return h;
  h.status = std::atoi(r.output.c_str() + nl + 1);
  h.body = r.output.substr(0, nl);
  return h;
}

json parse(const HttpReply& r) {
  json j = json::parse(r.body, nullptr, false);
  EXPECT_FALSE(j.is_discarded()) << r.body;
  return j;
}

// The "data:" payloads of an SSE body, in order.
std::vector<std::string> sse_data(const std::string& body) {
  std::vector<std::string> out;
  std::istringstream in(body);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("data: ", 0) == 0) out.push_back(line.substr(6));
  }
  return out;
}

// Sum of a metric's samples over its labels ("name{...} v" and "name v").
double metric(const std::string& text, const std::string& name) {
  double sum = 0;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(name + "{", 0) == 0 || line.rfind(name + " ", 0) == 0) {
      sum += std::stod(line.substr(line.rfind(' ') + 1));
    }
  }
  return sum;
}

std::string tools() { return TROUPE_TOOLS_DIR; }

const char* kGreedy8 = R"({"prompt": "Hello world", "max_tokens": 8, "temperature": 0, "ignore_eos": true)";

}  // namespace

TEST(HttpFront, CurlPlainAndStreamedAgreeWithTheZeroMqFront) {
  ServeProcess serve;
  const HttpReply plain = curl(serve.url() + "/v1/completions", std::string(kGreedy8) + "}");
  ASSERT_EQ(plain.status, 200) << plain.body << serve.log();
  const json p = parse(plain);
  EXPECT_EQ(p["object"], "text_completion");
  EXPECT_EQ(p["model"], "tiny");
  EXPECT_EQ(p["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(p["usage"]["prompt_tokens"], 2);
  EXPECT_EQ(p["usage"]["completion_tokens"], 8);
  EXPECT_EQ(p["usage"]["total_tokens"], 10);
  const std::string text = p["choices"][0]["text"];

  const HttpReply streamed =
      curl(serve.url() + "/v1/completions",
           std::string(kGreedy8) + R"(, "stream": true, "stream_options": {"include_usage": true}})");
  ASSERT_EQ(streamed.status, 200) << streamed.body;
  const auto events = sse_data(streamed.body);
  ASSERT_GE(events.size(), 3u) << streamed.body;
  EXPECT_EQ(events.back(), "[DONE]");
  std::string joined;
  int with_choices = 0;
  json usage;
  std::string finish;
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    const json c = json::parse(events[i]);
    EXPECT_EQ(c["id"], json::parse(events[0])["id"]) << "one id per completion";
    if (!c["choices"].empty()) {
      ++with_choices;
      joined += c["choices"][0]["text"].get<std::string>();
      if (!c["choices"][0]["finish_reason"].is_null()) finish = c["choices"][0]["finish_reason"];
    }
    if (c["usage"].is_object()) usage = c["usage"];
  }
  EXPECT_EQ(with_choices, 9) << "one chunk per token, then the one with finish_reason";
  EXPECT_EQ(joined, text) << "greedy: the stream says what the plain answer says";
  EXPECT_EQ(finish, "length");
  EXPECT_EQ(usage["completion_tokens"], 8);

  auto zmq = run_command(shell_quote(troupe::test::troupe_bin()) + " submit --to " + serve.zmq() +
                             " --prompt 'Hello world' --max-tokens 8 --temperature 0 --ignore-eos --json",
                         /*merge_stderr=*/false);
  ASSERT_EQ(zmq.status, 0) << zmq.output;
  EXPECT_EQ(json::parse(zmq.output)["text"], text) << "the same router behind both fronts";
}

TEST(HttpFront, ErrorsComeWithTheirStatusInOpenAisShape) {
  ServeProcess serve;
  const std::string url = serve.url();
  struct Case {
    std::string path, body;
    int status;
    std::string words;
  };
  const std::vector<Case> cases = {
      {"/v1/completions", R"({"prompt": "a", "n": 0})", 400, "n must be in"},
      {"/v1/completions", R"({"prompt": "a", "temperature": -1})", 400, "temperature"},
      {"/v1/completions", R"({"prompt": [99999999]})", 400, "outside the vocabulary"},
      {"/v1/completions", R"({"prompt": "a", "max_tokens": 5000})", 413, "exceeds the model's 512 positions"},
      {"/v1/completions", R"({"prompt": "a", "model": "gpt-4"})", 404, "does not exist"},
      {"/v1/completions", "not json", 400, "not valid JSON"},
      {"/v1/chat/completions", R"({"messages": []})", 400, "no chat template"},
      {"/v1/embeddings", R"({"input": "a"})", 404, "no route for POST /v1/embeddings"},
  };
  for (const Case& c : cases) {
    const HttpReply r = curl(url + c.path, c.body);
    EXPECT_EQ(r.status, c.status) << c.path << " " << c.body << " -> " << r.body;
    const json j = parse(r);
    ASSERT_TRUE(j.contains("error")) << r.body;
    EXPECT_NE(j["error"]["message"].get<std::string>().find(c.words), std::string::npos) << r.body;
    EXPECT_TRUE(j["error"]["type"].is_string());
  }
  const json models = parse(curl(url + "/v1/models"));
  EXPECT_EQ(models["data"][0]["id"], "tiny");
  EXPECT_EQ(models["data"][0]["max_model_len"], 512);
  const HttpReply health = curl(url + "/health");
  EXPECT_EQ(health.status, 200);
  EXPECT_EQ(parse(health)["workers"], 1);
  // Nothing above changed the server: it still serves.
  EXPECT_EQ(curl(url + "/v1/completions", std::string(kGreedy8) + "}").status, 200);
  EXPECT_EQ(serve.stop(), 0) << serve.log();
}

TEST(HttpFront, AFullQueueIs429AndNoWorkerIs503) {
  // Heartbeats a minute apart: the worker frozen below is not declared lost during the test.
  ServeProcess none({"--workers", "0", "--max-queue", "1", "--max-num-seqs", "1", "--heartbeat-ms", "60000"});
  const HttpReply h = curl(none.url() + "/health");
  EXPECT_EQ(h.status, 503) << h.body;
  EXPECT_EQ(parse(h)["workers"], 0);
  const HttpReply c = curl(none.url() + "/v1/completions", std::string(kGreedy8) + "}");
  EXPECT_EQ(c.status, 503) << c.body;
  EXPECT_EQ(parse(c)["error"]["code"], "no_workers");

  // A worker joins from its own process: /health turns 200 and the same request is served.
  troupe::test::TempDir dir;
  troupe::test::Process worker({troupe::test::troupe_bin(), "worker", "--join", none.worker_listen(),
                                "--model", troupe::test::tiny_http_model_dir(), "--threads-per-worker", "1"},
                               dir.file("worker.log"));
  const bool joined = troupe::test::eventually([&] { return curl(none.url() + "/health").status == 200; },
                                               std::chrono::seconds(120));
  ASSERT_TRUE(joined) << worker.log() << none.log();
  EXPECT_EQ(parse(curl(none.url() + "/health"))["workers"], 1);
  EXPECT_EQ(curl(none.url() + "/v1/completions", std::string(kGreedy8) + "}").status, 200);

  // The worker frozen: one job on it, one waiting (the queue's one place), and the next is busy.
  worker.signal(SIGSTOP);
  std::vector<std::unique_ptr<troupe::test::Process>> held;
  std::string text;
  for (const char* name : {"first.txt", "second.txt"}) {  // one after the other: each finds the queue free
    held.push_back(std::make_unique<troupe::test::Process>(
        std::vector<std::string>{"curl", "-sN", none.url() + "/v1/completions", "-H",
                                 "Content-Type: application/json", "-d",
                                 R"({"model":"tiny","prompt":"Hi","max_tokens":4,"stream":true})"},
        dir.file(name)));
    ASSERT_TRUE(troupe::test::eventually(
        [&] {
          text = curl(none.url() + "/metrics").body;
          return metric(text, "troupe:num_requests_running") == 1 &&
                 metric(text, "troupe:num_requests_waiting") == static_cast<double>(held.size() - 1);
        },
        std::chrono::seconds(60)))
        << text << none.log() << held.back()->log();
  }
  const HttpReply r = curl(none.url() + "/v1/completions", std::string(kGreedy8) + "}");
  EXPECT_EQ(r.status, 429) << r.body;
  EXPECT_EQ(parse(r)["error"]["code"], "busy");
  worker.signal(SIGCONT);
  for (auto& p : held) EXPECT_EQ(p->wait(std::chrono::seconds(60)), std::optional<int>(0)) << p->log();
}

TEST(HttpFront, AnApiKeyIsRequiredOnV1Only) {
  ServeProcess serve({"--api-key", "s3cret"});
  EXPECT_EQ(curl(serve.url() + "/v1/models").status, 401);
  EXPECT_EQ(
      curl(serve.url() + "/v1/completions", std::string(kGreedy8) + "}", "-H 'Authorization: Bearer wrong'")
          .status,
      401);
  EXPECT_EQ(
      curl(serve.url() + "/v1/completions", std::string(kGreedy8) + "}", "-H 'Authorization: Bearer s3cret'")
          .status,
      200);
  EXPECT_EQ(curl(serve.url() + "/health").status, 200) << "probes need no key";
}

TEST(HttpFront, AnOpenBindNeedsAKeyOrInsecure) {
  auto r = run_command(shell_quote(troupe::test::troupe_bin()) + " serve --model " +
                       shell_quote(troupe::test::tiny_http_model_dir()) + " --http 0.0.0.0:0");
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_NE(r.output.find("--api-key"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("--insecure"), std::string::npos) << r.output;
}

TEST(HttpFront, EachChoiceHasItsOwnSeedDerivedFromTheRequests) {
  ServeProcess serve;
  auto texts = [&](int n) {
    const HttpReply r =
        curl(serve.url() + "/v1/completions",
             R"({"prompt": "Once upon", "max_tokens": 12, "temperature": 1.0, "seed": 5, "n": )" +
                 std::to_string(n) + "}");
    EXPECT_EQ(r.status, 200) << r.body;
    std::vector<std::string> out;
    const json body = parse(r);  // not a temporary: the loop would iterate a destroyed object
    for (const auto& c : body["choices"]) out.push_back(c["text"]);
    return out;
  };
  const auto one = texts(1), three = texts(3), again = texts(3);
  ASSERT_EQ(three.size(), 3u);
  EXPECT_EQ(three[0], one[0]) << "choice 0 keeps the request's seed";
  EXPECT_EQ(three, again) << "seeded: the same choices every time";
  EXPECT_FALSE(three[0] == three[1] && three[1] == three[2]) << "three seeds, not one";
}

TEST(HttpFront, MetricsPassPromtoolAndCountWhatWasServed) {
  ServeProcess serve;
  for (int i = 0; i < 3; ++i)
    ASSERT_EQ(curl(serve.url() + "/v1/completions", std::string(kGreedy8) + "}").status, 200);
  const HttpReply m = curl(serve.url() + "/metrics");
  ASSERT_EQ(m.status, 200);
  EXPECT_EQ(metric(m.body, "troupe:request_success_total"), 3);
  EXPECT_EQ(metric(m.body, "troupe:generation_tokens_total"), 24);
  EXPECT_EQ(metric(m.body, "troupe:prompt_tokens_total"), 6);
  EXPECT_EQ(metric(m.body, "troupe:time_to_first_token_seconds_count"), 3);
  EXPECT_EQ(metric(m.body, "troupe:inter_token_latency_seconds_count"), 21);
  EXPECT_EQ(metric(m.body, "troupe:num_workers"), 1);
  EXPECT_EQ(metric(m.body, "troupe:num_requests_running"), 0);
  EXPECT_NE(m.body.find("troupe:kv_cache_usage_perc{model_name=\"tiny\",worker=\"1\"}"), std::string::npos);
  const std::string promtool = tools() + "/bin/promtool";
  if (!std::filesystem::exists(promtool))
    GTEST_SKIP() << "no " << promtool << " (scripts/setup.sh installs it)";
  troupe::test::TempDir dir;
  { std::ofstream(dir.file("m.txt")) << m.body; }
  auto r = run_command(shell_quote(promtool) + " check metrics < " + dir.file("m.txt"));
  EXPECT_TRUE(r.status == 0 || r.status == 3) << r.output;  // 3: lint findings only
  std::istringstream lines(r.output);
  for (std::string line; std::getline(lines, line);) {
    EXPECT_NE(line.find("should not contain ':'"), std::string::npos) << "only vLLM's ':' naming: " << line;
  }
}

// A streaming client that goes away mid-stream: its sequence is cancelled,
// its KV freed, and it generates nowhere near its max_tokens.
TEST(HttpFront, AClientThatLeavesMidStreamIsCancelled) {
  ServeProcess serve;
  {
    httplib::Client cli(serve.url());
    httplib::Request req;
    req.method = "POST";
    req.path = "/v1/completions";
    req.body =
        R"({"prompt": "Hello", "max_tokens": 500, "ignore_eos": true, "stream": true})";  // 1 + 500 <= 512
    req.set_header("Content-Type", "application/json");
    int events = 0;
    req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
      events += static_cast<int>(sse_data(std::string(data, n)).size());
      return events < 3;  // false: httplib drops the connection
    };
    httplib::Response res;
    httplib::Error err;
    EXPECT_FALSE(cli.send(req, res, err));
    EXPECT_GE(events, 3);
  }
  // The server notices at its next write; wait until the worker is idle again.
  std::string text;
  for (int i = 0; i < 600; ++i) {
    text = curl(serve.url() + "/metrics").body;
    if (metric(text, "troupe:num_requests_running") == 0 && metric(text, "troupe:kv_cache_usage_perc") == 0)
      break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_EQ(metric(text, "troupe:num_requests_running"), 0) << text;
  EXPECT_EQ(metric(text, "troupe:kv_cache_usage_perc"), 0) << text;
  EXPECT_EQ(metric(text, "troupe:request_success_total"), 1) << "it ended once";
  EXPECT_EQ(metric(text, R"(troupe:request_success_total{model_name="tiny",finished_reason="cancelled"})"), 1)
      << "as cancelled: " << text;
  const double generated = metric(text, "troupe:generation_tokens_total");
  EXPECT_GE(generated, 3);
  EXPECT_LT(generated, 500) << "cancelled, not run to max_tokens";
  // The status the ZeroMQ front shows agrees.
  auto st =
      run_command(shell_quote(troupe::test::troupe_bin()) + " status --json --to " + serve.zmq(), false);
  ASSERT_EQ(st.status, 0) << st.output;
  const json s = json::parse(st.output);
  EXPECT_EQ(s["workers"][0]["running"], 0);
  EXPECT_EQ(s["workers"][0]["kv_used"], 0);
}

TEST(HttpFront, TheOfficialOpenAiNpmClientWorks) {
  const std::string modules = tools() + "/node/node_modules";
  if (!std::filesystem::exists(modules + "/openai")) {
    GTEST_SKIP() << "no openai npm package in " << modules << " (scripts/setup.sh installs it)";
  }
  ServeProcess serve({"--api-key", "k"});
  const std::string script = std::string(TROUPE_TEST_DIR) + "/http/openai_npm_client.cjs";
  auto r = run_command(
      "NODE_PATH=" + shell_quote(modules) + " node " + shell_quote(script) + " " + serve.url() + " tiny k",
      /*merge_stderr=*/false);
  ASSERT_EQ(r.status, 0) << r.output << serve.log();
  const json j = json::parse(r.output);
  EXPECT_EQ(j["finish"], "length");
  EXPECT_EQ(j["usage"]["completion_tokens"], 6);
  EXPECT_EQ(j["stream_text"], j["text"]);
  EXPECT_EQ(j["stream_chunks"], 7);
  EXPECT_EQ(j["stream_finish"], "length");
  EXPECT_EQ(j["stream_usage"]["completion_tokens"], 6);
  EXPECT_EQ(j["error"]["status"], 400) << "max_tokens 0 is refused without echo";
  EXPECT_NE(j["error"]["message"].get<std::string>().find("max_tokens"), std::string::npos) << j.dump();

  // lm-evaluation-harness's loglikelihood request: the prompt echoed in
  // OpenAI's legacy shape, every logprob equal to a full forward's.
  const model::Tokenizer tok = model::Tokenizer::from_dir(tiny_http_model_dir());
  const std::vector<int32_t> ids = tok.encode("Hello world, said the");
  EXPECT_EQ(j["scored_text"], "Hello world, said the");
  EXPECT_EQ(j["scored_finish"], "length");
  EXPECT_EQ(j["scored_usage"]["completion_tokens"], 0);
  EXPECT_EQ(j["scored_usage"]["prompt_tokens"], static_cast<int>(ids.size()));
  const json& lp = j["scored_logprobs"];
  ASSERT_EQ(lp["tokens"].size(), ids.size()) << j.dump();
  EXPECT_TRUE(lp["token_logprobs"][0].is_null());
  EXPECT_TRUE(lp["top_logprobs"][0].is_null());
  EXPECT_EQ(lp["text_offset"][0], 0);
  EXPECT_EQ(lp["text_offset"][1], 5) << "\"Hello\" before \" world\"";
  auto md = model::load_model_dir(tiny_http_model_dir());
  model::Gpt2 gpt(md.config, std::move(md.weights), torch::kCPU);
  at::NoGradGuard no_grad;
  const torch::Tensor lsm = torch::log_softmax(gpt.forward_full(ids).to(torch::kDouble), 1);
  for (size_t p = 1; p < ids.size(); ++p) {
    EXPECT_NEAR(lp["token_logprobs"][p].get<double>(), lsm[static_cast<int64_t>(p) - 1][ids[p]].item<double>(), 1e-4)
        << "position " << p;
    EXPECT_EQ(lp["tokens"][p], tok.decode({ids[p]}));
    EXPECT_LE(lp["top_logprobs"][p].size(), 2u) << "the token and its top 1";
  }
  ASSERT_EQ(j["batch"].size(), 2u);
  EXPECT_EQ(j["batch"][0]["text"], "Hello world");
  EXPECT_EQ(j["batch"][1]["logprobs"]["token_logprobs"].size(), 3u);
  EXPECT_TRUE(j["batch"][1]["logprobs"]["token_logprobs"][0].is_null());
  const json& pl = j["vllm_prompt_logprobs"];
  ASSERT_EQ(pl.size(), 2u) << "\"Hello world\": two tokens" << j.dump();
  EXPECT_TRUE(pl[0].is_null());
  EXPECT_TRUE(pl[1].contains("995")) << pl.dump();
  EXPECT_GE(pl[1]["995"]["rank"].get<int>(), 1);
  EXPECT_EQ(pl[1]["995"]["decoded_token"], " world");
  EXPECT_EQ(j["echo_stream_text"].get<std::string>().rfind("Hello world", 0), 0u) << j.dump();
  EXPECT_GT(j["echo_stream_text"].get<std::string>().size(), std::string("Hello world").size());
}

// troupe perplexity scored by a running head (ZeroMQ) and by its HTTP front
// (what lm-evaluation-harness sends) equals the one computed here.
TEST(HttpFront, PerplexityThroughTheHeadAndTheHttpFrontEqualsTheLocalOne) {
  ServeProcess serve({"--api-key", "k", "--max-batched-tokens", "24"});
  troupe::test::TempDir dir;
  const std::string text = dir.file("text.txt");
  {
    std::ofstream out(text);
    for (int i = 0; i < 12; ++i) out << "Line " << i << ": the quick brown fox jumps over the lazy dog.\n";
  }
  const std::string base = shell_quote(troupe::test::troupe_bin()) + " perplexity --model " +
                           shell_quote(tiny_http_model_dir()) + " --file " + shell_quote(text) +
                           " --context 48 --stride 20 --json";
  auto parse = [](const troupe::test::CommandResult& r) {
    EXPECT_EQ(r.status, 0) << r.output;
    return json::parse(r.output.substr(r.output.rfind('{')));
  };
  const json local = parse(run_command(base, /*merge_stderr=*/false));
  const json head = parse(run_command(base + " --to " + serve.zmq() + " --max-in-flight 3", false));
  const json http = parse(run_command(base + " --base-url " + serve.url() + " --api-key k", false));
  ASSERT_GT(local["windows"].get<int>(), 3);
  for (const json* j : {&head, &http}) {
    EXPECT_EQ((*j)["tokens_scored"], local["tokens_scored"]) << j->dump();
    EXPECT_EQ((*j)["windows"], local["windows"]);
    EXPECT_NEAR((*j)["ppl"].get<double>(), local["ppl"].get<double>(), 1e-4 * local["ppl"].get<double>())
        << j->dump() << "\n" << serve.log();
  }
  EXPECT_EQ(head["scored_by"], serve.zmq());
  EXPECT_EQ(http["scored_by"], serve.url());
  // A wrong key is the server's 401, named.
  auto bad = run_command(base + " --base-url " + serve.url() + " --api-key wrong");
  EXPECT_NE(bad.status, 0);
  EXPECT_NE(bad.output.find("HTTP 401"), std::string::npos) << bad.output;

  // submit --input speaks the same JSONL fields as batch.
  {
    std::ofstream in(dir.file("jobs.jsonl"));
    in << R"({"id": 1, "prompt": "Hello world", "echo": true, "logprobs": 0, "max_tokens": 0})" << "\n"
       << R"({"id": 2, "prompt": "Hello world", "prompt_logprobs": 1, "max_tokens": 1})" << "\n";
  }
  auto r = run_command(shell_quote(troupe::test::troupe_bin()) + " submit --to " + serve.zmq() + " --input " +
                       shell_quote(dir.file("jobs.jsonl")) + " --output " + shell_quote(dir.file("out.jsonl")) +
                       " --quiet");
  ASSERT_EQ(r.status, 0) << r.output;
  std::ifstream res(dir.file("out.jsonl"));
  std::string l1, l2;
  std::getline(res, l1);
  std::getline(res, l2);
  const json a = json::parse(l1), b = json::parse(l2);
  EXPECT_EQ(a["text"], "Hello world");
  EXPECT_EQ(a["prompt_ids"], json::array({15496, 995}));
  ASSERT_EQ(a["logprobs"].size(), 2u) << a;
  EXPECT_TRUE(a["logprobs"][0]["logprob"].is_null());
  EXPECT_LT(a["logprobs"][1]["logprob"].get<double>(), 0.0);
  ASSERT_EQ(b["prompt_logprobs"].size(), 2u) << b;
  EXPECT_NEAR(b["prompt_logprobs"][1]["logprob"].get<double>(), a["logprobs"][1]["logprob"].get<double>(), 1e-5);
  EXPECT_EQ(b["ids"].size(), 1u);
}

TEST(HttpFront, BenchMeasuresBothFrontsTheSameWay) {
  ServeProcess serve;
  troupe::test::TempDir dir;
  std::vector<json> input_lens;
  for (const std::string& target : {"--base-url " + serve.url(), "--to " + serve.zmq()}) {
    const std::string out = dir.file("r.json");
    auto r = run_command(shell_quote(troupe::test::troupe_bin()) + " bench " + target +
                         " --num-requests 6 --request-rate 50 --max-concurrency 4 --random-input-len 8"
                         " --random-output-len 5 --seed 3 --goodput ttft:100000 --quiet --json " +
                         shell_quote(out));
    ASSERT_EQ(r.status, 0) << target << "\n" << r.output << serve.log();
    EXPECT_NE(r.output.find("Serving Benchmark Result"), std::string::npos) << r.output;
    std::ifstream in(out);
    const json j = json::parse(in);
    EXPECT_EQ(j["completed"], 6) << target;
    EXPECT_EQ(j["failed"], 0);
    EXPECT_EQ(j["total_input_tokens"], 48);
    EXPECT_EQ(j["total_output_tokens"], 30);
    EXPECT_EQ(j["max_concurrency"], 4);
    EXPECT_EQ(j["request_goodput"], j["request_throughput"]) << "every request meets a 100 s TTFT";
    for (const char* k :
         {"request_throughput", "output_throughput", "mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms",
          "mean_tpot_ms", "median_tpot_ms", "mean_itl_ms", "mean_e2el_ms", "p90_e2el_ms"}) {
      EXPECT_TRUE(j[k].is_number()) << k;
    }
    input_lens.push_back(j["input_lens"]);
    ASSERT_EQ(j["ttfts"].size(), 6u);
    ASSERT_EQ(j["itls"].size(), 6u);
    for (const auto& gaps : j["itls"])
      EXPECT_LE(gaps.size(), 4u) << "at most one gap per token after the first";
  }
  ASSERT_EQ(input_lens.size(), 2u);
  EXPECT_EQ(input_lens[0], input_lens[1]) << "the same seed, the same requests, whichever front";
}

TEST(HttpFront, BenchPlotsPngAndSvgWithGnuplot) {
  if (run_command("command -v gnuplot").status != 0)
    GTEST_SKIP() << "no gnuplot (scripts/setup.sh installs gnuplot-nox)";
  ServeProcess serve;
  troupe::test::TempDir dir;
  auto r = run_command(
      shell_quote(troupe::test::troupe_bin()) + " bench --base-url " + serve.url() +
      " --num-requests 4 --request-rate 20,inf --random-input-len 8 --random-output-len 4 --seed 1"
      " --quiet --plot " +
      shell_quote(dir.file("plots")));
  ASSERT_EQ(r.status, 0) << r.output;
  for (const std::string f : {"sweep", "rate-20/latency_cdf", "rate-20/throughput", "rate-inf/latency_cdf"}) {
    for (const char* ext : {".png", ".svg"}) {
      const std::string path = dir.file("plots/" + f + ext);
      EXPECT_TRUE(std::filesystem::exists(path) && std::filesystem::file_size(path) > 0) << path;
    }
  }
}

// The parameters reach the router as OpenAI means them: a batch of prompts
// times n, stop strings (the text ends before the stop), logprobs.
TEST(HttpFront, BatchesStopsAndLogprobsMeanWhatOpenAiSays) {
  ServeProcess serve;
  const std::string url = serve.url() + "/v1/completions";
  const json base = parse(curl(url, std::string(kGreedy8) + "}"));
  const std::string text = base["choices"][0]["text"];
  ASSERT_GE(text.size(), 4u) << base.dump();

  const HttpReply batch =
      curl(url, R"({"prompt": ["Hello world", "Hello world"], "n": 2, "max_tokens": 8, "temperature": 0,
                    "ignore_eos": true})");
  ASSERT_EQ(batch.status, 200) << batch.body;
  const json b = parse(batch);
  ASSERT_EQ(b["choices"].size(), 4u);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(b["choices"][i]["index"], i);
    EXPECT_EQ(b["choices"][i]["text"], text) << "greedy: every choice of every copy of the prompt";
  }
  EXPECT_EQ(b["usage"]["prompt_tokens"], 4) << "each prompt counted once, not once per choice";
  EXPECT_EQ(b["usage"]["completion_tokens"], 32);

  const std::string stop = text.substr(1, 3);
  const HttpReply stopped = curl(
      url, R"({"prompt": "Hello world", "max_tokens": 8, "temperature": 0, "ignore_eos": true, "stop": )" +
               json(stop).dump() + "}");
  ASSERT_EQ(stopped.status, 200) << stopped.body;
  const json s = parse(stopped);
  EXPECT_EQ(s["choices"][0]["finish_reason"], "stop") << s.dump();
  EXPECT_EQ(s["choices"][0]["text"], text.substr(0, text.find(stop))) << "the text ends before the stop";

  const HttpReply lp =
      curl(url, R"({"prompt": "Hello world", "max_tokens": 8, "temperature": 0, "ignore_eos": true,
                    "logprobs": 2})");
  ASSERT_EQ(lp.status, 200) << lp.body;
  const json l = parse(lp)["choices"][0]["logprobs"];
  ASSERT_EQ(l["tokens"].size(), 8u) << l.dump();
  ASSERT_EQ(l["token_logprobs"].size(), 8u);
  ASSERT_EQ(l["top_logprobs"].size(), 8u);
  std::string joined;
  for (size_t i = 0; i < 8; ++i) {
    joined += l["tokens"][i].get<std::string>();
    const double chosen = l["token_logprobs"][i];
    EXPECT_LE(chosen, 0.0);
    EXPECT_EQ(l["top_logprobs"][i].size(), 2u) << "greedy: the chosen token is one of the top 2";
    for (const auto& [tok, v] : l["top_logprobs"][i].items()) EXPECT_LE(v.get<double>(), chosen) << tok;
  }
  EXPECT_EQ(joined, text);

  // logit_bias and the penalties (OpenAI's meanings): +100 on "," makes it
  // every token; a presence penalty of 2 keeps greedy decoding off every
  // token it already chose (on this model, whose greedy text repeats).
  const HttpReply forced = curl(url, std::string(kGreedy8) + R"(, "logit_bias": {"11": 100}})");
  ASSERT_EQ(forced.status, 200) << forced.body;
  EXPECT_EQ(parse(forced)["choices"][0]["text"], ",,,,,,,,");
  auto tokens = [&](const std::string& extra) {
    const HttpReply r = curl(url, R"({"prompt": "Hello world", "max_tokens": 24, "temperature": 0,
                                      "ignore_eos": true, "logprobs": 0)" +
                                      extra + "}");
    EXPECT_EQ(r.status, 200) << r.body;
    return parse(r)["choices"][0]["logprobs"]["tokens"].get<std::vector<std::string>>();
  };
  const auto repeating = tokens(""), fresh = tokens(R"(, "presence_penalty": 2)");
  ASSERT_EQ(fresh.size(), 24u);
  EXPECT_LT(std::set<std::string>(repeating.begin(), repeating.end()).size(), 24u);
  EXPECT_EQ(std::set<std::string>(fresh.begin(), fresh.end()).size(), 24u);
}

// Past --drain-timeout the jobs still open end with an error each client
// sees: a stream gets the error and [DONE], `troupe submit` an error line per
// job carrying the server's reason (told, not timed out after its own 120 s
// of silence: that line would say "no answer from the head") and exits 1.
TEST(HttpFront, DrainTimeoutEndsOpenJobsWithAnErrorTheirClientsSee) {
  using std::chrono::seconds;
  ServeProcess serve({"--drain-timeout", "4", "--max-num-seqs", "1"});
  troupe::test::TempDir dir;
  {
    // One at a time, 128 x 500 tokens (0.3-1 ms a token here): far more work than the drain allows.
    std::ofstream jobs(dir.file("jobs.jsonl"));
    for (int i = 0; i < 128; ++i)
      jobs << json{{"id", i}, {"prompt", "Hello"}, {"max_tokens", 500}, {"ignore_eos", true}}.dump() << "\n";
  }
  troupe::test::Process submit({troupe::test::troupe_bin(), "submit", "--to", serve.zmq(), "--input",
                                dir.file("jobs.jsonl"), "--output", dir.file("out.jsonl"), "--quiet"},
                               dir.file("submit.log"));
  auto status = [&] {
    auto r =
        run_command(shell_quote(troupe::test::troupe_bin()) + " status --json --to " + serve.zmq(), false);
    return r.status == 0 ? json::parse(r.output) : json{};
  };
  ASSERT_TRUE(troupe::test::eventually(
      [&] {
        const json s = status();
        return !s.empty() && s["requests_running"].get<int>() + s["requests_served"].get<int>() == 128;
      },
      seconds(60)));
  const std::string body =
      R"({"model":"tiny","prompt":"Hi","max_tokens":400,"ignore_eos":true,"stream":true})";
  troupe::test::Process stream(
      {"curl", "-sN", serve.url() + "/v1/completions", "-H", "Content-Type: application/json", "-d", body},
      dir.file("stream.txt"));
  ASSERT_TRUE(troupe::test::eventually(
      [&] {
        const json s = status();
        return !s.empty() && s["requests_running"].get<int>() + s["requests_served"].get<int>() == 129;
      },
      seconds(60)))
      << stream.log();

  serve.signal(SIGTERM);
  // Draining: a load balancer must send new work elsewhere.
  EXPECT_TRUE(troupe::test::eventually(
      [&] {
        const HttpReply h = curl(serve.url() + "/health", "", "--max-time 2");
        return h.status == 503 && h.body.find("\"draining\"") != std::string::npos;
      },
      seconds(30)));
  EXPECT_EQ(serve.wait(seconds(60)), std::optional<int>(0)) << serve.log();
  EXPECT_EQ(submit.wait(seconds(60)), std::optional<int>(1)) << submit.log();
  EXPECT_NE(serve.log().find("job(s) unfinished"), std::string::npos) << serve.log();

  const std::string why = "the server stopped before this job finished (--drain-timeout 4 s ran out)";
  std::ifstream out(dir.file("out.jsonl"));
  int lines = 0, ended = 0;
  for (std::string line; std::getline(out, line); ++lines) {
    const json j = json::parse(line);
    if (j.contains("error")) {
      EXPECT_EQ(j["error"], why) << line;
      ++ended;
    } else {
      EXPECT_EQ(j["finish_reason"], "length") << line;
    }
  }
  EXPECT_EQ(lines, 128) << "a line for every job";
  EXPECT_GE(ended, 1);

  ASSERT_EQ(stream.wait(seconds(30)), std::optional<int>(0)) << stream.log();
  const std::string sse = stream.log();
  EXPECT_NE(sse.find(why), std::string::npos) << sse;
  EXPECT_EQ(sse.substr(sse.size() - std::string("data: [DONE]\n\n").size()), "data: [DONE]\n\n") << sse;
}

// A request of more sequences (prompts x n) than --max-queue could never
// start: 400 naming n, not a 429 that a client would retry for ever.
TEST(HttpFront, MoreSequencesThanTheQueueHoldsIsABadRequest) {
  ServeProcess serve({"--max-queue", "2"});
  const std::string url = serve.url() + "/v1/completions";
  const HttpReply big = curl(url, R"({"model":"tiny","prompt":"a","max_tokens":2,"n":3})");
  EXPECT_EQ(big.status, 400) << big.body;
  const json e = parse(big);
  EXPECT_EQ(e["error"]["param"], "n") << big.body;
  EXPECT_NE(e["error"]["message"].get<std::string>().find("at most 2 (--max-queue)"), std::string::npos)
      << big.body;
  const HttpReply two = curl(url, R"({"model":"tiny","prompt":["a","b"],"max_tokens":2})");
  EXPECT_EQ(two.status, 200) << two.body;
}

// A client of a plain (not streamed) completion that hangs up: its jobs are
// cancelled within moments, not run to the end for nobody.
TEST(HttpFront, AClientThatHangsUpBeforeItsAnswerIsCancelled) {
  using std::chrono::seconds;
  ServeProcess serve({"--max-num-seqs", "1"});  // one at a time: ~256 x 500 tokens, minutes of work
  const std::string body = R"({"model":"tiny","prompt":"Hello","max_tokens":500,"ignore_eos":true,"n":256})";
  const HttpReply cut = curl(serve.url() + "/v1/completions", body, "--max-time 1");
  EXPECT_EQ(cut.status, 0) << "curl gave up before the answer: " << cut.body;
  std::string text;
  const bool idle = troupe::test::eventually(
      [&] {
        text = curl(serve.url() + "/metrics").body;
        return metric(text, "troupe:num_requests_running") == 0 &&
               metric(text, "troupe:num_requests_waiting") == 0;
      },
      seconds(20));
  EXPECT_TRUE(idle) << text;
  const double cancelled =
      metric(text, R"(troupe:request_success_total{model_name="tiny",finished_reason="cancelled"})");
  EXPECT_GE(cancelled, 200) << text;
  EXPECT_EQ(metric(text, "troupe:request_success_total"), 256) << text;
}
