#include "cluster/loadgen/remote_scoring.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <map>
#include <mutex>
#include <stdexcept>
#include <thread>

#include <nlohmann/json.hpp>

#include "cluster/loadgen/openai_client.hpp"

namespace troupe::cluster {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

void check(const std::vector<std::vector<int32_t>>& windows, const RemoteScoring& o) {
  if (o.max_in_flight < 1) throw std::invalid_argument("remote scoring: max_in_flight must be >= 1");
  for (const auto& w : windows)
    if (w.empty()) throw std::invalid_argument("remote scoring: a window has no token");
}

}  // namespace

std::vector<std::vector<float>> score_windows(const ClientOptions& head, const std::vector<std::vector<int32_t>>& windows,
                                              const RemoteScoring& o) {
  check(windows, o);
  const auto n = static_cast<int64_t>(windows.size());
  std::vector<std::vector<float>> out(windows.size());
  if (n == 0) return out;
  Client client(head);
  auto submit = [&](int64_t w) {
    transport::Submit s;
    s.tag = static_cast<uint64_t>(w) + 1;
    s.prompt_ids = windows[static_cast<size_t>(w)];
    s.max_tokens = 0;
    s.prompt_logprobs = 0;
    s.temperature = 0.0f;
    client.send(s);
  };
  std::map<Clock::time_point, int64_t> retry_at;  // busy windows, sent again later
  std::vector<bool> scored(windows.size(), false);
  int64_t next = 0, in_flight = 0, done = 0;
  auto last_heard = Clock::now();
  while (done < n) {
    while (in_flight < o.max_in_flight && next < n) {
      submit(next++);
      ++in_flight;
    }
    while (!retry_at.empty() && retry_at.begin()->first <= Clock::now() && in_flight < o.max_in_flight) {
      submit(retry_at.begin()->second);
      retry_at.erase(retry_at.begin());
      ++in_flight;
    }
    std::optional<transport::Message> m = client.next(std::chrono::milliseconds(100));
    if (!m) {
      if (Clock::now() - last_heard > o.timeout)
        throw std::runtime_error("no answer from the head at " + head.endpoint + " for " +
                                 std::to_string(o.timeout.count()) + " s");
      continue;
    }
    last_heard = Clock::now();
    auto window_of = [&](uint64_t tag) -> int64_t {
      if (tag < 1 || tag > static_cast<uint64_t>(n)) throw std::runtime_error("the head answered an unknown job");
      return static_cast<int64_t>(tag) - 1;
    };
    if (auto* e = std::get_if<transport::Error>(&*m))
      throw std::runtime_error(std::string("the head: ") + transport::to_string(e->code) + ": " + e->message);
    if (auto* r = std::get_if<transport::Rejected>(&*m)) {
      const int64_t w = window_of(r->tag);
      if (r->code != transport::RejectCode::kBusy)
        throw std::runtime_error("window " + std::to_string(w) + " refused: " + r->message);
      --in_flight;
      retry_at.emplace(Clock::now() + std::chrono::milliseconds(200), w);
    } else if (auto* t = std::get_if<transport::Tokens>(&*m)) {
      if (t->prompt_ids.empty()) continue;
      const int64_t w = window_of(t->tag);
      if (t->prompt_ids != windows[static_cast<size_t>(w)])
        throw std::runtime_error("window " + std::to_string(w) + ": the head scored other tokens");
      auto& lp = out[static_cast<size_t>(w)];
      for (const auto& s : t->prompt_logprobs) lp.push_back(s.logprob);
      scored[static_cast<size_t>(w)] = true;
    } else if (auto* f = std::get_if<transport::Finished>(&*m)) {
      const int64_t w = window_of(f->tag);
      if (f->finish_reason == core::FinishReason::kError)
        throw std::runtime_error("window " + std::to_string(w) + " failed: " + f->error);
      if (!scored[static_cast<size_t>(w)] || out[static_cast<size_t>(w)].size() + 1 != windows[static_cast<size_t>(w)].size())
        throw std::runtime_error("window " + std::to_string(w) + " finished without its prompt's logprobs (" +
                                 core::to_string(f->finish_reason) + ")");
      --in_flight;
      ++done;
      if (o.progress) o.progress(done, n);
    }
  }
  return out;
}

std::vector<std::vector<float>> score_windows_http(const std::string& base_url, const std::string& api_key,
                                                   const std::string& model,
                                                   const std::vector<std::vector<int32_t>>& windows,
                                                   const RemoteScoring& o) {
  check(windows, o);
  const auto n = static_cast<int64_t>(windows.size());
  std::vector<std::vector<float>> out(windows.size());
  std::atomic<int64_t> next{0}, done{0};
  std::mutex mu;  // first_error, progress
  std::string first_error;
  auto score_one = [&](int64_t w) {
    const auto& ids = windows[static_cast<size_t>(w)];
    json body{{"prompt", ids}, {"echo", true}, {"logprobs", 0}, {"max_tokens", 0}, {"temperature", 0.0}};
    if (!model.empty()) body["model"] = model;
    json answer;
    for (int attempt = 0;; ++attempt) {
      try {
        answer = post_completion(base_url, api_key, body, o.timeout);
        break;
      } catch (const std::runtime_error& e) {  // a busy server (429) is asked again, a little later
        if (std::string(e.what()).find("HTTP 429") == std::string::npos || attempt >= 1000) throw;
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
      }
    }
    const json* lp = nullptr;
    if (answer.contains("choices") && answer["choices"].is_array() && !answer["choices"].empty() &&
        answer["choices"][0].contains("logprobs") && answer["choices"][0]["logprobs"].is_object())
      lp = &answer["choices"][0]["logprobs"];
    if (!lp || !lp->contains("token_logprobs") || !(*lp)["token_logprobs"].is_array())
      throw std::runtime_error("window " + std::to_string(w) + ": the answer has no logprobs.token_logprobs");
    const json& t = (*lp)["token_logprobs"];
    // echo with max_tokens 0: one entry per prompt token, the first null.
    if (t.size() < ids.size())
      throw std::runtime_error("window " + std::to_string(w) + ": " + std::to_string(t.size()) +
                               " token logprobs for " + std::to_string(ids.size()) + " prompt tokens");
    std::vector<float> v;
    for (size_t i = 1; i < ids.size(); ++i) {
      if (!t[i].is_number()) throw std::runtime_error("window " + std::to_string(w) + ": a null logprob past the first");
      v.push_back(t[i].get<float>());
    }
    out[static_cast<size_t>(w)] = std::move(v);
  };
  auto worker = [&] {
    for (int64_t w = next.fetch_add(1); w < n; w = next.fetch_add(1)) {
      {
        std::lock_guard<std::mutex> lock(mu);
        if (!first_error.empty()) return;
      }
      try {
        score_one(w);
      } catch (const std::exception& e) {
        std::lock_guard<std::mutex> lock(mu);
        if (first_error.empty()) first_error = e.what();
        return;
      }
      const int64_t d = done.fetch_add(1) + 1;
      std::lock_guard<std::mutex> lock(mu);
      if (o.progress) o.progress(d, n);
    }
  };
  std::vector<std::thread> threads;
  for (int32_t i = 0; i < std::min<int64_t>(o.max_in_flight, std::max<int64_t>(n, 1)); ++i) threads.emplace_back(worker);
  for (auto& t : threads) t.join();
  if (!first_error.empty()) throw std::runtime_error(first_error);
  return out;
}

}  // namespace troupe::cluster
