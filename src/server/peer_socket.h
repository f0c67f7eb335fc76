// Lets a handler that waits (a non-streaming completion) notice that its client has
// gone. cpp-httplib 0.11 gives handlers no socket and no disconnect signal (0.11 tells
// only streaming responses, through a failed write; later versions add
// Request::is_connection_closed), but each Request carries its connection's local and
// remote address: the one socket of this process with both is that connection's, and
// it stays open until the handler returns.
#pragma once

#include <string>

namespace hsx {

// The numeric host and port of one end of a TCP socket (the peer's or this process's),
// exactly as cpp-httplib 0.11 writes them into a Request; false if it has none.
bool SocketEndpoint(int fd, bool peer, std::string& host, int& port);

// The descriptor of this process's TCP socket with these endpoints (as cpp-httplib
// prints them: numeric host, port), or -1 if there is none or /proc/self/fd is missing.
int FindPeerSocket(const std::string& local_addr, int local_port, const std::string& remote_addr, int remote_port);

// True once the peer has closed, reset or shut down its side of the connection (an
// HTTP client that still wants its response does none of these). Only peeks, so bytes
// it sent (a next request on a kept-alive connection) stay unread; never blocks.
bool PeerHasClosed(int fd);

}  // namespace hsx
