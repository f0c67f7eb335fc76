// cpp-httplib's server with what Debian's compiled 0.11 lacks in front of real clients:
// - a deep listen backlog (0.11 listens with 5, so a burst of clients waited for SYN
//   retries, a second each) and a thread per open connection (`threads` of them);
// - its own connection loop (process_and_close_socket is 0.11's one hook) with a deadline
//   for a request's line and headers as a whole and a cap on their size: 0.11 has only a
//   per-read timeout, which a peer sending a byte every few seconds never trips, so slow
//   peers could hold every thread;
// - a graceful stop. 0.11's stop() also ends every chunked (streaming) response at its next
//   chunk; StopAccepting only closes the listening socket and ends idle keep-alive
//   connections, so requests under way finish, and Cut then ends the waits of
//   connections still reading or writing.
#pragma once

#include <httplib.h>

#include <atomic>
#include <mutex>
#include <string>

namespace hsx {

class HttpServer : public httplib::Server {
 public:
  struct Limits {
    size_t threads = 512;
    // A request's line and headers: from the accept, or on a kept-alive connection from
    // the request's first byte.
    double header_seconds = 10;
    double read_seconds = 5;   // each wait for more of a request body
    double write_seconds = 5;  // each wait for a client to take more of a response
  };
  explicit HttpServer(const Limits& limits);
  ~HttpServer() override;

  // Binds, listens with `backlog`, then serves until StopAccepting and every connection
  // has closed. False if the address cannot be bound or accepting fails otherwise.
  bool Listen(const std::string& host, int port, int backlog);
  // New connections are refused; an idle kept-alive connection, or one still sending its
  // headers, is closed; requests already read run to the end. Safe before Listen.
  void StopAccepting();
  // Ends every wait on a client: reads fail, writes fail unless the socket takes them now.
  void Cut();
  bool stopping() const { return stopping_.load(); }

 private:
  bool process_and_close_socket(socket_t sock) override;

  const Limits limits_;
  int stop_event_ = -1, cut_event_ = -1;  // eventfds, readable once StopAccepting / Cut ran
  std::mutex listen_mu_;
  bool listening_ = false;  // under listen_mu_
  std::atomic<bool> stopping_{false};
};

}  // namespace hsx
