#include "transport/step_link.hpp"

namespace troupe::transport {

void Unacked::sent(uint64_t seq, std::string body, Clock::time_point now) {
  frames_.push_back({seq, std::move(body), now});
  if (seq > last_sent_) last_sent_ = seq;
}

void Unacked::acked(uint64_t seq) {
  while (!frames_.empty() && frames_.front().seq <= seq) frames_.pop_front();
}

std::vector<std::string> Unacked::resend(uint64_t have, Clock::time_point now, Clock::duration grace) {
  acked(have);
  std::vector<std::string> out;
  for (Frame& f : frames_) {
    if (now - f.sent < grace) continue;
    f.sent = now;
    out.push_back(f.body);
  }
  return out;
}

}  // namespace troupe::transport
