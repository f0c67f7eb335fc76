// cpp-httplib's server with the two limits Debian's compiled 0.11 fixes raised: the
// listen backlog (5, so a burst of clients overflowed the accept queue and waited
// for SYN retries, a second each) and the thread pool (max(8, cores - 1) threads, each
// held by one connection, idle keep-alive ones included, until it closes).
#pragma once

#include <httplib.h>
#include <sys/socket.h>

#include <string>

namespace hsx {

class HttpServer : public httplib::Server {
 public:
  explicit HttpServer(size_t threads) {
    new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  }

  // Binds, deepens the accept queue, then serves until stop(); false if the address
  // cannot be bound.
  bool Listen(const std::string& host, int port, int backlog) {
    if (!bind_to_port(host, port)) return false;
    ::listen(svr_sock_, backlog);  // on a listening socket this only resizes its queue
    return listen_after_bind();
  }
};

}  // namespace hsx
