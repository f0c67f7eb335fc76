#include "server/http_server.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <climits>
#include <cstring>
#include <string_view>
#include <vector>

#include "server/peer_socket.h"

namespace hsx {
namespace {

using Clock = std::chrono::steady_clock;

// A request's line and headers together; 0.11 bounds each header line, not their number.
constexpr size_t kMaxHeaderBytes = 64 << 10;
// Beyond the cap on incoming bodies, a body may still come whole within this time of its
// request's start (a fast client's body often follows its headers in a second packet),
// and up to this size, held in the connection's buffer without a body slot.
constexpr double kOverCapGraceSeconds = 1;
constexpr size_t kMaxGraceBodyBytes = 1 << 20;
// Closing a connection whose request was refused unread: read what the peer still sends
// until it pauses this long, for at most this long and this many bytes.
constexpr double kLingerPauseSeconds = 0.1, kLingerSeconds = 1;
constexpr size_t kLingerBytes = 1 << 20;
constexpr size_t kReceiveBytes = 16 << 10;

Clock::duration Seconds(double seconds) {
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

Clock::time_point After(double seconds) { return Clock::now() + Seconds(seconds); }

void Signal(int event_fd) {
  const uint64_t one = 1;
  [[maybe_unused]] const ssize_t n = ::write(event_fd, &one, sizeof(one));
}

bool Signaled(int event_fd) {
  pollfd p{event_fd, POLLIN, 0};
  return ::poll(&p, 1, 0) > 0;
}

std::string FormatSeconds(double seconds) {
  char text[32];
  std::snprintf(text, sizeof(text), "%gs", seconds);
  return text;
}

bool EqualsIgnoringCase(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) == std::tolower(static_cast<unsigned char>(y));
         });
}

std::string_view Trimmed(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

// What a request's headers say of its body: only enough to know whether it has arrived
// (cpp-httplib parses them again to read it).
struct BodyShape {
  bool chunked = false;
  size_t length = 0;  // Content-Length; 0 without one (or an unreadable one: 0.11 reads none then)
};

BodyShape ShapeOf(std::string_view head) {
  BodyShape shape;
  size_t line_end = head.find("\r\n");  // past the request line
  while (line_end != std::string_view::npos) {
    const size_t start = line_end + 2;
    line_end = head.find("\r\n", start);
    const std::string_view line = head.substr(start, line_end == std::string_view::npos ? 0 : line_end - start);
    const size_t colon = line.find(':');
    if (colon == std::string_view::npos) continue;
    const std::string_view name = line.substr(0, colon), value = Trimmed(line.substr(colon + 1));
    if (EqualsIgnoringCase(name, "Content-Length")) {
      size_t length = 0;
      const auto [end, err] = std::from_chars(value.data(), value.data() + value.size(), length);
      shape.length = err == std::errc() && end == value.data() + value.size() ? length : 0;
    } else if (EqualsIgnoringCase(name, "Transfer-Encoding") && value.find("chunked") != std::string_view::npos) {
      shape.chunked = true;
    }
  }
  return shape;
}

// Why the body of the request this thread handles could not be read.
thread_local HttpServer::BodyError t_body_error;

// One connection's socket as cpp-httplib reads and writes it. A request's line and headers
// are read whole into the buffer first (by one deadline, up to a size cap), so
// cpp-httplib never waits for them; then each wait for body bytes is bounded by the read
// timeout and the body's deadline, and takes a body slot; each write by the write
// timeout. Cut ends every wait, StopAccepting every wait for a request.
class ConnectionStream : public httplib::Stream {
 public:
  enum class Head { kReady, kGone, kLineTooLong, kTooLarge };

  ConnectionStream(int sock, int stop_event, int cut_event, const HttpServer::Limits& limits,
                   std::atomic<size_t>& bodies)
      : sock_(sock), stop_event_(stop_event), cut_event_(cut_event), limits_(limits), bodies_(bodies) {}
  ~ConnectionStream() override { EndBody(); }

  // Whether a next request begins by `deadline`; false once stopping with none begun.
  bool WaitForRequest(Clock::time_point deadline) { return off_ < buf_.size() || Wait(POLLIN, deadline, true); }

  // Reads the next request's line and headers, due by `deadline`, into the buffer.
  Head ReadHead(Clock::time_point deadline) {
    buf_.erase(buf_.begin(), buf_.begin() + static_cast<ptrdiff_t>(off_));
    off_ = 0;
    for (size_t scanned = 0;;) {
      const std::string_view data(buf_.data(), std::min(buf_.size(), kMaxHeaderBytes));
      const size_t end = data.find("\r\n\r\n", scanned < 3 ? 0 : scanned - 3);
      if (end != std::string_view::npos) {
        head_left_ = end + 4;
        body_read_ = 0;
        shape_ = ShapeOf(data.substr(0, head_left_));
        body_deadline_ = After(limits_.body_seconds);
        return Head::kReady;
      }
      if (data.size() == kMaxHeaderBytes) {
        const size_t line = data.find('\n');
        const bool line_too_long = line == std::string_view::npos || line > CPPHTTPLIB_REQUEST_URI_MAX_LENGTH;
        return line_too_long ? Head::kLineTooLong : Head::kTooLarge;
      }
      scanned = data.size();
      if (!Wait(POLLIN, deadline, true) || !Receive()) return Head::kGone;
    }
  }

  // Takes a body slot for a body still to arrive. With none free, the body may still
  // arrive whole by `grace` (up to kMaxGraceBodyBytes). False: no room for this body.
  bool StartBody(Clock::time_point grace) {
    if (BodyBuffered() || TakeSlot()) return true;
    if (!shape_.chunked && shape_.length > kMaxGraceBodyBytes) return false;
    while (!BodyBuffered()) {
      if (buf_.size() > kMaxHeaderBytes + kMaxGraceBodyBytes) return false;
      if (!Wait(POLLIN, grace, true) || !Receive()) return false;
    }
    return true;
  }

  // The request's body is read, or will not be: its slot is free for another.
  void EndBody() {
    if (has_slot_) bodies_.fetch_sub(1);
    has_slot_ = false;
  }

  // After a refusal: no more is sent; what the peer still sends is read for a moment,
  // since closing with its bytes unread would send a reset, which can destroy the answer
  // before the peer reads it.
  void Linger() {
    ::shutdown(sock_, SHUT_WR);
    const auto until = After(kLingerSeconds);
    for (size_t drained = 0; drained < kLingerBytes;) {
      buf_.clear();
      off_ = 0;
      if (!Wait(POLLIN, std::min(until, After(kLingerPauseSeconds)), false) || !Receive()) return;
      drained += buf_.size();
    }
  }

  bool is_readable() const override { return off_ < buf_.size() || Wait(POLLIN, BodyWaitDeadline(), false); }
  bool is_writable() const override { return Wait(POLLOUT, After(limits_.write_seconds), false); }

  // A body read failed (a deadline, a stop): the connection is not worth keeping.
  bool failed() const { return failed_; }

  ssize_t read(char* ptr, size_t size) override {
    while (off_ == buf_.size()) {  // only a body waits here: a request's head is read whole first
      buf_.clear();
      off_ = 0;
      if (!Wait(POLLIN, BodyWaitDeadline(), true)) return Fail();
      if (!Receive()) return 0;
    }
    const size_t n = std::min(size, buf_.size() - off_);
    std::memcpy(ptr, buf_.data() + off_, n);
    off_ += n;
    const size_t head = std::min(n, head_left_);
    head_left_ -= head;
    body_read_ += n - head;
    if (!shape_.chunked && body_read_ >= shape_.length) EndBody();
    return static_cast<ssize_t>(n);
  }

  ssize_t write(const char* ptr, size_t size) override {
    // An answer begins: the body is read, or never will be. Not so after "100 Continue",
    // which asks for the body.
    if (!std::string_view(ptr, size).starts_with("HTTP/1.1 1")) EndBody();
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

  // Appends what the socket has (nothing on a spurious wakeup); false once it has ended.
  bool Receive() {
    const size_t old = buf_.size();
    buf_.resize(old + kReceiveBytes);
    const ssize_t n = ::recv(sock_, buf_.data() + old, kReceiveBytes, MSG_DONTWAIT);
    const bool again = n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR);
    buf_.resize(old + static_cast<size_t>(std::max<ssize_t>(n, 0)));
    return n > 0 || again;
  }

  // Whether the whole body is in the buffer (a chunked one: judged by its last chunk).
  bool BodyBuffered() const {
    const size_t buffered = buf_.size() - off_ - head_left_;
    if (!shape_.chunked) return buffered >= shape_.length;
    return std::string_view(buf_.data(), buf_.size()).ends_with("\r\n0\r\n\r\n");
  }

  bool TakeSlot() {
    const size_t cap = limits_.max_incoming_bodies;
    for (size_t n = bodies_.load(); n < cap;) {
      if (bodies_.compare_exchange_weak(n, n + 1)) return has_slot_ = true;
    }
    return false;
  }

  Clock::time_point BodyWaitDeadline() const { return std::min(After(limits_.read_seconds), body_deadline_); }

  ssize_t Fail() {
    failed_ = true;
    if (Signaled(cut_event_) || Signaled(stop_event_)) {
      t_body_error = {503, "the server is shutting down: the request body had not arrived"};
    } else if (Clock::now() >= body_deadline_) {
      t_body_error = {408, "the request body did not arrive within " + FormatSeconds(limits_.body_seconds) +
                               " of its headers (--http-body-timeout)"};
    } else {
      t_body_error = {408, "the client paused for over " + FormatSeconds(limits_.read_seconds) +
                               " while sending the request body (--http-read-timeout)"};
    }
    return -1;
  }

  const int sock_, stop_event_, cut_event_;
  const HttpServer::Limits& limits_;
  std::atomic<size_t>& bodies_;
  std::vector<char> buf_;
  size_t off_ = 0;        // buf_[off_, end) is unread
  size_t head_left_ = 0;  // of the request's line and headers, bytes cpp-httplib has not read
  size_t body_read_ = 0;
  BodyShape shape_;
  Clock::time_point body_deadline_ = Clock::time_point::max();
  bool has_slot_ = false, failed_ = false;
};

const char* Reason(int status) {
  switch (status) {
    case 414:
      return "URI Too Long";
    case 431:
      return "Request Header Fields Too Large";
    default:
      return "Service Unavailable";
  }
}

// Answers a request the server will not read (its head too large, or no room for its
// body) with `status` and an OpenAI-shaped error, then closes.
void Refuse(ConnectionStream& stream, int status, const std::string& message) {
  const std::string body = "{\"error\":{\"message\":\"" + message + "\",\"type\":\"" +
                           (status == 503 ? "server_overloaded" : "invalid_request_error") +
                           "\",\"param\":null,\"code\":" + std::to_string(status) + "}}";
  const std::string answer = "HTTP/1.1 " + std::to_string(status) + " " + Reason(status) +
                             "\r\nContent-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
                             (status == 503 ? "\r\nRetry-After: 1" : "") + "\r\nConnection: close\r\n\r\n" + body;
  for (size_t sent = 0; sent < answer.size();) {
    const ssize_t n = stream.write(answer.data() + sent, answer.size() - sent);
    if (n < 0) return;
    sent += static_cast<size_t>(n);
  }
  stream.Linger();
}

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

HttpServer::Limits WithDefaults(HttpServer::Limits limits) {
  if (limits.max_incoming_bodies == 0) limits.max_incoming_bodies = std::max<size_t>(1, limits.threads / 4);
  return limits;
}

}  // namespace

HttpServer::HttpServer(const Limits& limits)
    : limits_(WithDefaults(limits)), stop_event_(::eventfd(0, EFD_CLOEXEC)), cut_event_(::eventfd(0, EFD_CLOEXEC)) {
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

HttpServer::BodyError HttpServer::LastBodyError() { return t_body_error; }

bool HttpServer::process_and_close_socket(socket_t sock) {
  ConnectionStream stream(sock, stop_event_, cut_event_, limits_, incoming_bodies_);
  bool ok = true;
  for (size_t left = keep_alive_max_count_; left > 0 && ok; --left) {
    // The first request is due from the accept, a later one from its first byte.
    const bool first = left == keep_alive_max_count_;
    const auto idle_deadline =
        (first ? t_accepted : Clock::now()) + Seconds(static_cast<double>(keep_alive_timeout_sec_));
    if (!stream.WaitForRequest(idle_deadline)) break;
    const auto begun = first ? t_accepted : Clock::now();
    const auto head = stream.ReadHead(begun + Seconds(limits_.header_seconds));
    if (head == ConnectionStream::Head::kGone) break;
    if (head == ConnectionStream::Head::kLineTooLong) {
      Refuse(stream, 414, "the request line is longer than the server reads");
      break;
    }
    if (head == ConnectionStream::Head::kTooLarge) {
      Refuse(stream, 431, "the request's headers are larger than 64 KiB");
      break;
    }
    // While stopping, the request gets 503 unread (OpenAiServer's pre-routing handler).
    if (!stopping() && !stream.StartBody(begun + Seconds(kOverCapGraceSeconds))) {
      Refuse(stream, 503, "too many request bodies are arriving at once; retry later");
      break;
    }
    t_body_error = {};
    bool closed = false;
    ok = process_request(stream, left == 1 || stopping(), closed, nullptr);
    stream.EndBody();
    if (closed || stopping() || stream.failed()) break;
  }
  ::shutdown(sock, SHUT_RDWR);
  ::close(sock);
  return ok;
}

}  // namespace hsx
