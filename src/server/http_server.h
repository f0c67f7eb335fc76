// cpp-httplib's server with what Debian's compiled 0.11 lacks in front of real clients:
// - a deep listen backlog (0.11 listens with 5, so a burst of clients waited for SYN
//   retries, a second each) and a thread per open connection (`threads` of them);
// - its own connection loop (process_and_close_socket is 0.11's one hook) that reads a
//   request's line and headers itself, with a deadline for them as a whole and a cap on
//   their size (414 / 431 beyond it): 0.11 has only a per-read timeout, which a peer
//   sending a byte every few seconds never trips, so slow peers could hold every thread;
// - the same for bodies: a deadline for a whole body, and a cap on the connections
//   waiting for body bytes at once (beyond it a body that has not arrived gets 503), so
//   slow uploads hold at most that many threads, each for a bounded time;
// - a graceful stop. 0.11's stop() also ends every chunked (streaming) response at its next
//   chunk; StopAccepting only closes the listening socket and ends idle keep-alive
//   connections and requests still arriving, so requests under way finish, and Cut then
//   ends the waits of connections still reading or writing.
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
    double body_seconds = 30;  // a whole request body, from the end of its headers
    // Connections waiting for body bytes at once; 0: a quarter of the threads (at least 1).
    size_t max_incoming_bodies = 0;
  };
  explicit HttpServer(const Limits& limits);
  ~HttpServer() override;

  // Binds, listens with `backlog`, then serves until StopAccepting and every connection
  // has closed. False if the address cannot be bound or accepting fails otherwise.
  bool Listen(const std::string& host, int port, int backlog);
  // New connections are refused; an idle kept-alive connection, or one still sending its
  // headers or body, is closed (a body cut short gets 503); requests already read run to
  // the end. Safe before Listen.
  void StopAccepting();
  // Ends every wait on a client: reads fail, writes fail unless the socket takes them now.
  void Cut();
  bool stopping() const { return stopping_.load(); }

  // Why the body of the request this thread handles could not be read: an HTTP status
  // (408 its deadline passed, 503 the server is stopping, 400 otherwise) and a message.
  struct BodyError {
    int status = 400;
    std::string message = "the request body could not be read";
  };
  static BodyError LastBodyError();

 private:
  bool process_and_close_socket(socket_t sock) override;

  const Limits limits_;
  int stop_event_ = -1, cut_event_ = -1;  // eventfds, readable once StopAccepting / Cut ran
  std::mutex listen_mu_;
  bool listening_ = false;  // under listen_mu_
  std::atomic<bool> stopping_{false};
  std::atomic<size_t> incoming_bodies_{0};  // connections holding a body slot
};

}  // namespace hsx
