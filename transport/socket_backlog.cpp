#include "transport/socket_backlog.hpp"

namespace troupe::transport {

void SocketBacklog::queue(Peer& p, std::string&& body) {
  p.bytes += body.size();
  bytes_ += body.size();
  ++frames_;
  p.frames.push_back(std::move(body));
}

SocketBacklog::Pushed SocketBacklog::push(const std::string& peer, std::string&& body) {
  Peer& p = peers_[peer];
  if (p.cut) {
    ++cut_frames_;
    return Pushed::kDropped;
  }
  const bool too_many = limits_.max_frames && p.frames.size() + 1 > limits_.max_frames;
  const bool too_big = limits_.max_bytes && p.bytes + body.size() > limits_.max_bytes;
  if (too_many || too_big) {
    p.cut = true;
    ++peers_cut_;
    ++cut_frames_;
    return Pushed::kCut;
  }
  queue(p, std::move(body));
  return Pushed::kQueued;
}

void SocketBacklog::add_farewell(const std::string& peer, std::string&& body) {
  auto it = peers_.find(peer);
  if (it != peers_.end() && it->second.cut) queue(it->second, std::move(body));
}

SocketBacklog::Retried SocketBacklog::retry(const Sender& send) {
  Retried r;
  for (auto it = peers_.begin(); it != peers_.end();) {
    Peer& p = it->second;
    Sent last = Sent::kSent;
    while (!p.frames.empty()) {
      const size_t size = p.frames.front().size();
      last = send(it->first, p.frames.front());
      if (last != Sent::kSent) break;
      p.frames.pop_front();
      p.bytes -= size;
      bytes_ -= size;
      --frames_;
    }
    if (last == Sent::kGone) {
      r.gone.emplace_back(it->first, p.frames.size());
      frames_ -= p.frames.size();
      bytes_ -= p.bytes;
    } else if (!p.frames.empty()) {
      ++it;
      continue;
    } else if (p.cut) {
      r.whole.push_back(it->first);
    }
    it = peers_.erase(it);
  }
  return r;
}

}  // namespace troupe::transport
