#pragma once
// SocketBacklog: the frames a server socket could not hand to a peer yet
// (its ZeroMQ queue was at send_hwm), kept in order per peer, and the bounds
// past which a peer that does not read is cut. Bookkeeping only: no ZeroMQ,
// no clock, no thread; SocketLoop's loop thread owns one per server socket
// and does the sending through retry().
//
//                  frame would block               backlog sent
//   ┌──────────┐ ────────────────────▶ ┌────────┐ ──────────────▶ ┌──────────┐
//   │ ordinary │                       │ behind │                 │ ordinary │
//   └──────────┘                       └────────┘                 └──────────┘
//                                          │ a frame would pass a bound:
//                                          ▼ not queued; farewell queued last
//                                      ┌────────┐   backlog sent  ┌──────────┐
//                                      │  cut   │ ──────────────▶ │ ordinary │
//                                      └────────┘   (whole again) └──────────┘
//   behind / cut ──peer gone──▶ backlog dropped (ordinary)
//
// While a peer is behind every new frame for it queues last (order kept);
// while it is cut every new frame is dropped and counted.
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <string>
#include <unordered_map>
#include <vector>

namespace troupe::transport {

struct BacklogLimits {
  size_t max_frames = 10000;    // frames waiting per peer; 0 = no limit
  size_t max_bytes = 64 << 20;  // body bytes waiting per peer; 0 = no limit
};

class SocketBacklog {
 public:
  explicit SocketBacklog(BacklogLimits limits = {}) : limits_(limits) {}

  // True while frames wait for `peer` or it is cut: a new frame for it must
  // go through push(), not to the socket.
  bool holds(const std::string& peer) const { return peers_.count(peer) != 0; }

  enum class Pushed {
    kQueued,   // last in the peer's backlog
    kCut,      // it would have passed a bound: not queued, and the peer is cut from now on
    kDropped,  // the peer was already cut
  };
  Pushed push(const std::string& peer, std::string&& body);
  // Queues the last frame a cut peer gets, past the bounds. Only after kCut.
  void add_farewell(const std::string& peer, std::string&& body);

  enum class Sent {
    kSent,        // handed over: the frame leaves the backlog
    kWouldBlock,  // the peer's queue is full: try again at the next retry
    kGone,        // the peer is gone: its whole backlog is dropped
  };
  // `send` may move from `body` only when it returns kSent.
  using Sender = std::function<Sent(const std::string& peer, std::string& body)>;
  struct Retried {
    std::vector<std::pair<std::string, size_t>> gone;  // peers lost, with the frames dropped for each
    std::vector<std::string> whole;                    // cut peers whose backlog is sent: ordinary again
  };
  // Sends each peer's frames oldest first until its backlog is empty or
  // `send` answers kWouldBlock or kGone.
  Retried retry(const Sender& send);

  size_t frames() const { return frames_; }  // waiting now, all peers
  size_t bytes() const { return bytes_; }
  uint64_t peers_cut() const { return peers_cut_; }    // since construction
  uint64_t cut_frames() const { return cut_frames_; }  // dropped for cut peers, each cutting frame included

 private:
  struct Peer {
    std::deque<std::string> frames;
    size_t bytes = 0;
    bool cut = false;
  };
  void queue(Peer& p, std::string&& body);

  BacklogLimits limits_;
  std::unordered_map<std::string, Peer> peers_;
  size_t frames_ = 0, bytes_ = 0;
  uint64_t peers_cut_ = 0, cut_frames_ = 0;
};

}  // namespace troupe::transport
