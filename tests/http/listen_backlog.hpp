#pragma once
// For the tests' stand-in servers (cpp-httplib): Debian's cpp-httplib is a
// compiled library (libcpp-httplib.so) that listens with an accept backlog
// of 5 whatever CPPHTTPLIB_LISTEN_BACKLOG says where it is included, and sets
// SO_REUSEPORT, so a second server on the same port would bind too and take
// half of the connections. A burst of connects (a client opening 16 streams
// at once) overflows 5: the kernel drops the handshakes' last ACKs and the
// clients wait 1 s for a retransmission. This sets SO_REUSEADDR alone (a
// port in use is an error; a restart is not), and after_bind() raises the
// bound socket's backlog (listen again: Linux updates the queue's length).
#include <httplib.h>
#include <sys/socket.h>

#include <memory>
#include <stdexcept>

namespace troupe::test {

class ListenBacklog {
 public:
  // Before binding `server`.
  explicit ListenBacklog(httplib::Server& server, int backlog = 1024)
      : fd_(std::make_shared<int>(-1)), backlog_(backlog) {
    server.set_socket_options([fd = fd_](socket_t sock) {
      int yes = 1;
      ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
      *fd = sock;  // the last socket tried is the one bound
    });
  }
  // After a successful bind; std::runtime_error if the socket is unknown or listen() fails.
  void after_bind() const {
    if (*fd_ < 0) throw std::runtime_error("the HTTP server's listening socket is unknown");
    if (::listen(*fd_, backlog_) != 0) throw std::runtime_error("cannot raise the HTTP listen backlog");
  }

 private:
  std::shared_ptr<int> fd_;
  int backlog_;
};

}  // namespace troupe::test
