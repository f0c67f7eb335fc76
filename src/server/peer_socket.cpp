#include "server/peer_socket.h"

#include <dirent.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstdlib>
#include <memory>

namespace hsx {

// getnameinfo with NI_NUMERICHOST, as cpp-httplib, so the strings compare equal.
bool SocketEndpoint(int fd, bool peer, std::string& host, int& port) {
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  auto* sa = reinterpret_cast<sockaddr*>(&addr);
  if ((peer ? getpeername(fd, sa, &len) : getsockname(fd, sa, &len)) != 0) return false;
  if (addr.ss_family == AF_INET) {
    port = ntohs(reinterpret_cast<const sockaddr_in*>(&addr)->sin_port);
  } else if (addr.ss_family == AF_INET6) {
    port = ntohs(reinterpret_cast<const sockaddr_in6*>(&addr)->sin6_port);
  } else {
    return false;
  }
  char buf[NI_MAXHOST];
  if (getnameinfo(sa, len, buf, sizeof(buf), nullptr, 0, NI_NUMERICHOST) != 0) return false;
  host = buf;
  return true;
}

int FindPeerSocket(const std::string& local_addr, int local_port, const std::string& remote_addr, int remote_port) {
  std::unique_ptr<DIR, int (*)(DIR*)> dir(opendir("/proc/self/fd"), closedir);
  if (!dir) return -1;
  const int own = dirfd(dir.get());
  while (const dirent* entry = readdir(dir.get())) {
    char* end = nullptr;
    const long fd = std::strtol(entry->d_name, &end, 10);
    if (end == entry->d_name || *end != '\0' || fd == own) continue;
    std::string host;
    int port = -1;
    // The peer's end first: it rules out every other client's connection.
    if (!SocketEndpoint(static_cast<int>(fd), true, host, port) || port != remote_port || host != remote_addr) continue;
    if (SocketEndpoint(static_cast<int>(fd), false, host, port) && port == local_port && host == local_addr) {
      return static_cast<int>(fd);
    }
  }
  return -1;
}

bool PeerHasClosed(int fd) {
  pollfd p{fd, POLLIN | POLLRDHUP, 0};
  if (poll(&p, 1, 0) <= 0) return false;  // nothing happened (or EINTR: look again next time)
  if (p.revents & (POLLERR | POLLHUP | POLLRDHUP | POLLNVAL)) return true;
  char byte;
  const ssize_t n = recv(fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
  return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

}  // namespace hsx
