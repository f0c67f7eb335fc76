#include "server/http_server.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstring>

#include "server/peer_socket.h"

namespace hsx {
namespace {

using Clock = std::chrono::steady_clock;

// A request's line and headers together; 0.11 bounds each header line, not their number.
constexpr size_t kMaxHeaderBytes = 64 << 10;

Clock::duration Seconds(double seconds) {
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

Clock::time_point After(double seconds) { return Clock::now() + Seconds(seconds); }

void Signal(int event_fd) {
  const uint64_t one = 1;
  [[maybe_unused]] const ssize_t n = ::write(event_fd, &one, sizeof(one));
}

// One connection's socket as cpp-httplib reads and writes it: buffered reads, each wait
// bounded (the headers by one deadline, each body read by the read timeout, each write
// by the write timeout), every wait ended by Cut and a wait for headers by StopAccepting.
class ConnectionStream : public httplib::Stream {
 public:
  ConnectionStream(int sock, int stop_event, int cut_event, const HttpServer::Limits& limits)
      : sock_(sock), stop_event_(stop_event), cut_event_(cut_event), limits_(limits) {}

  // Whether a next request begins by `deadline`; false once stopping with none begun.
  bool WaitForRequest(Clock::time_point deadline) { return off_ < len_ || Wait(POLLIN, deadline, true); }

  // The bytes from here on are a new request, whose line and headers are due by `deadline`.
  void BeginRequest(Clock::time_point deadline) {
    in_headers_ = true;
    header_bytes_ = 0;
    tail_ = 0;
    header_deadline_ = deadline;
  }

  bool is_readable() const override { return off_ < len_ || Wait(POLLIN, After(limits_.read_seconds), false); }
  bool is_writable() const override { return Wait(POLLOUT, After(limits_.write_seconds), false); }

  // A read failed (a deadline, a cap, a stop): the connection is not worth keeping.
  bool failed() const { return failed_; }

  ssize_t read(char* ptr, size_t size) override {
    if (in_headers_ && header_bytes_ >= kMaxHeaderBytes) return Fail();
    while (off_ == len_) {
      const bool ok =
          in_headers_ ? Wait(POLLIN, header_deadline_, true) : Wait(POLLIN, After(limits_.read_seconds), false);
      if (!ok) return Fail();
      const ssize_t n = ::recv(sock_, buf_, sizeof(buf_), MSG_DONTWAIT);
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) continue;
      if (n <= 0) return n;
      off_ = 0;
      len_ = static_cast<size_t>(n);
    }
    size_t n = std::min(size, len_ - off_);
    if (in_headers_) {
      n = std::min(n, kMaxHeaderBytes - header_bytes_);
      for (size_t i = 0; i < n && in_headers_; ++i) {  // the headers end at the first CRLF CRLF
        tail_ = (tail_ << 8) | static_cast<unsigned char>(buf_[off_ + i]);
        ++header_bytes_;
        if (tail_ == 0x0d0a0d0au) {
          in_headers_ = false;
          n = i + 1;
        }
      }
    }
    std::memcpy(ptr, buf_ + off_, n);
    off_ += n;
    return static_cast<ssize_t>(n);
  }

  ssize_t write(const char* ptr, size_t size) override {
    if (!Wait(POLLOUT, After(limits_.write_seconds), false)) return -1;
    const ssize_t n = ::send(sock_, ptr, size, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return 0;  // wait again
    return n;
  }

  void get_remote_ip_and_port(std::string& ip, int& port) const override { SocketEndpoint(sock_, true, ip, port); }
  void get_local_ip_and_port(std::string& ip, int& port) const override { SocketEndpoint(sock_, false, ip, port); }
  socket_t socket() const override { return sock_; }

 private:
  // True once the socket has `events` (or an error the next call reports); false at the
  // deadline, on Cut, and with `until_stop` on StopAccepting. Ready beats stopping: bytes
  // that have arrived are read, a write the socket takes now is made.
  bool Wait(short events, Clock::time_point deadline, bool until_stop) const {
    for (;;) {
      pollfd fds[3] = {{sock_, events, 0}, {cut_event_, POLLIN, 0}, {until_stop ? stop_event_ : -1, POLLIN, 0}};
      const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now()).count();
      const int n = ::poll(fds, 3, static_cast<int>(std::clamp<decltype(left)>(left, 0, INT_MAX)));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return false;
      if (fds[0].revents != 0) return true;
      if (n > 0 || Clock::now() >= deadline) return false;
    }
  }

  ssize_t Fail() {
    failed_ = true;
    return -1;
  }

  const int sock_, stop_event_, cut_event_;
  const HttpServer::Limits& limits_;
  char buf_[4096];
  size_t off_ = 0, len_ = 0;  // buffered, unread: buf_[off_, len_)
  bool in_headers_ = false, failed_ = false;
  size_t header_bytes_ = 0;
  uint32_t tail_ = 0;  // the last four header bytes
  Clock::time_point header_deadline_;
};

// When the connection this pool thread now serves was accepted.
thread_local Clock::time_point t_accepted;

// cpp-httplib's thread pool, telling each connection when it was accepted: its first
// request's deadlines count from then, so connections that waited in the queue behind
// slow peers (while their own bytes trickled in) get no fresh allowance.
class AcceptTimeQueue : public httplib::TaskQueue {
 public:
  explicit AcceptTimeQueue(size_t threads) : pool_(threads) {}
  void enqueue(std::function<void()> fn) override {
    pool_.enqueue([fn = std::move(fn), accepted = Clock::now()] {
      t_accepted = accepted;
      fn();
    });
  }
  void shutdown() override { pool_.shutdown(); }

 private:
  httplib::ThreadPool pool_;
};

}  // namespace

HttpServer::HttpServer(const Limits& limits)
    : limits_(limits), stop_event_(::eventfd(0, EFD_CLOEXEC)), cut_event_(::eventfd(0, EFD_CLOEXEC)) {
  new_task_queue = [n = limits.threads] { return new AcceptTimeQueue(n); };
}

HttpServer::~HttpServer() {
  ::close(stop_event_);
  ::close(cut_event_);
}

bool HttpServer::Listen(const std::string& host, int port, int backlog) {
  if (stop_event_ < 0 || cut_event_ < 0 || !bind_to_port(host, port)) return false;
  {
    std::lock_guard<std::mutex> lock(listen_mu_);
    ::listen(svr_sock_, backlog);  // on a listening socket this only resizes its queue
    listening_ = true;
    if (stopping_) ::shutdown(svr_sock_, SHUT_RDWR);  // stopped before it began: accept fails at once
  }
  const bool ok = listen_after_bind();
  std::lock_guard<std::mutex> lock(listen_mu_);
  listening_ = false;
  return ok || stopping_;
}

void HttpServer::StopAccepting() {
  std::lock_guard<std::mutex> lock(listen_mu_);
  if (stopping_.exchange(true)) return;
  Signal(stop_event_);
  // accept() then fails, and cpp-httplib closes the socket and waits for the connections.
  if (listening_) ::shutdown(svr_sock_, SHUT_RDWR);
}

void HttpServer::Cut() {
  StopAccepting();
  Signal(cut_event_);
}

bool HttpServer::process_and_close_socket(socket_t sock) {
  ConnectionStream stream(sock, stop_event_, cut_event_, limits_);
  bool ok = true;
  for (size_t left = keep_alive_max_count_; left > 0 && ok; --left) {
    // The first request is due from the accept, a later one from its first byte.
    const bool first = left == keep_alive_max_count_;
    const auto idle_deadline =
        (first ? t_accepted : Clock::now()) + Seconds(static_cast<double>(keep_alive_timeout_sec_));
    if (!stream.WaitForRequest(idle_deadline)) break;
    stream.BeginRequest((first ? t_accepted : Clock::now()) + Seconds(limits_.header_seconds));
    bool closed = false;
    ok = process_request(stream, left == 1 || stopping(), closed, nullptr);
    if (closed || stopping() || stream.failed()) break;
  }
  ::shutdown(sock, SHUT_RDWR);
  ::close(sock);
  return ok;
}

}  // namespace hsx
