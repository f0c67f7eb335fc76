#include "capture/mooncake_client.h"

#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "capture/mooncake_helper_source.h"

extern char** environ;

namespace hsx {
namespace {

constexpr size_t kStagingGranule = size_t{64} << 20;  // hs_connectors' _STAGING_GRANULE
const char* kInstallHint =
    "install Mooncake's Python package into it: `pip install mooncake-transfer-engine-non-cuda` "
    "(CPU machines; needs Debian's libibverbs1) or `pip install mooncake-transfer-engine` (CUDA)";

std::string Errno(const std::string& what) { return what + ": " + std::strerror(errno); }

// HSX_PYTHON, else the first executable python3 on PATH.
Result<std::string> FindPython() {
  if (const char* p = std::getenv("HSX_PYTHON"); p && *p) {
    if (::access(p, X_OK) != 0) return Error("HSX_PYTHON=" + std::string(p) + " is not an executable");
    return std::string(p);
  }
  const char* path = std::getenv("PATH");
  std::string dirs = path ? path : "/usr/bin:/bin";
  size_t start = 0;
  while (start <= dirs.size()) {
    size_t end = dirs.find(':', start);
    if (end == std::string::npos) end = dirs.size();
    std::string candidate = (end > start ? dirs.substr(start, end - start) : ".") + "/python3";
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
    start = end + 1;
  }
  return Error("no python3 on PATH (set HSX_PYTHON to a Python 3 that has the mooncake package)");
}

// Whether something accepts connections at host:port within timeout_ms.
Status ProbeTcp(const HostPort& hp, int timeout_ms) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const int gai = ::getaddrinfo(hp.host.c_str(), std::to_string(hp.port).c_str(), &hints, &res);
  if (gai != 0) return Error("cannot resolve '" + hp.host + "': " + ::gai_strerror(gai));
  std::string last = "no address";
  Status result = Error(last);
  for (addrinfo* a = res; a; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    int rc = ::connect(fd, a->ai_addr, a->ai_addrlen);
    if (rc != 0 && errno == EINPROGRESS) {
      pollfd p{fd, POLLOUT, 0};
      rc = ::poll(&p, 1, timeout_ms);
      if (rc == 0) {
        errno = ETIMEDOUT;
        rc = -1;
      } else if (rc > 0) {
        int err = 0;
        socklen_t len = sizeof(err);
        ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
        errno = err;
        rc = err ? -1 : 0;
      }
    }
    const int err = errno;
    ::close(fd);
    if (rc == 0) {
      result = Status();
      break;
    }
    result = Error(std::strerror(err));
  }
  ::freeaddrinfo(res);
  return result;
}

Status SendAll(int fd, const std::string& msg, int memfd) {
  iovec iov{const_cast<char*>(msg.data()), msg.size()};
  msghdr mh{};
  mh.msg_iov = &iov;
  mh.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))];
  if (memfd >= 0) {
    mh.msg_control = control;
    mh.msg_controllen = sizeof(control);
    cmsghdr* c = CMSG_FIRSTHDR(&mh);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(c), &memfd, sizeof(int));
  }
  if (::sendmsg(fd, &mh, MSG_NOSIGNAL) != static_cast<ssize_t>(msg.size())) return Error(Errno("sending to it"));
  return {};
}

Result<nlohmann::json> Receive(int fd, int timeout_ms) {
  pollfd p{fd, POLLIN, 0};
  int rc;
  do {
    rc = ::poll(&p, 1, timeout_ms);
  } while (rc < 0 && errno == EINTR);
  if (rc == 0) return Error("no answer within " + std::to_string(timeout_ms / 1000) + " s");
  if (rc < 0) return Error(Errno("waiting for it"));
  std::string buf(1 << 16, '\0');
  const ssize_t n = ::recv(fd, buf.data(), buf.size(), 0);
  if (n == 0) return Error("closed its channel");
  if (n < 0) return Error(Errno("reading from it"));
  buf.resize(static_cast<size_t>(n));
  auto reply = nlohmann::json::parse(buf, nullptr, false);
  if (!reply.is_object() || !reply.contains("status") || !reply["status"].is_number_integer()) {
    return Error("it answered '" + buf.substr(0, 200) + "'");
  }
  return reply;
}

std::string StatusText(const nlohmann::json& reply) {
  const int64_t status = reply["status"].get<int64_t>();
  std::string text = "status " + std::to_string(status);
  // Mooncake's ErrorCode values (mooncake-store's types.h) that a put meets in practice.
  if (status == -200) text += " (no space left in the store: a larger global_segment_size, or fewer objects kept)";
  if (status == -800) text += " (the transfer to the segment's owner failed: a mooncake_client or hsx that died)";
  if (status == -900) {
    text += " (no answer from the Mooncake master: is mooncake_master up? Mooncake's client reconnects to a restarted "
            "master by itself)";
  }
  if (reply.contains("error") && reply["error"].is_string()) text += ": " + reply["error"].get<std::string>();
  return text;
}

}  // namespace

Result<std::unique_ptr<MooncakeClient>> MooncakeClient::Connect(const MooncakeConfig& config,
                                                                const Options& options) {
  HSX_ASSIGN_OR_RETURN(HostPort master, ParseHostPort(config.master_server_address));
  // Mooncake's own setup retries an absent master for ~90 s; a probe says so at once.
  if (Status probe = ProbeTcp(master, options.probe_timeout_ms); !probe.ok()) {
    return Error("the Mooncake master at " + config.master_server_address + " is not reachable (" + probe.message() +
                 "); start it first: `mooncake_master --rpc_port=" + std::to_string(master.port) +
                 "` (from the mooncake-transfer-engine PyPI package)");
  }
  HSX_ASSIGN_OR_RETURN(std::string python, FindPython());

  std::unique_ptr<MooncakeClient> client(new MooncakeClient(config, options));
  std::vector<int> child_fds;
  for (int i = 0; i < config.num_writer_threads; ++i) {
    int sv[2];
    if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0) {
      for (int fd : child_fds) ::close(fd);
      return Error(Errno("Mooncake helper: socketpair"));
    }
    client->channels_.push_back(Channel{sv[0]});
    child_fds.push_back(sv[1]);
  }
  std::string fd_list;
  for (int fd : child_fds) fd_list += (fd_list.empty() ? "" : ",") + std::to_string(fd);
  // Everything the child needs is made before fork: only async-signal-safe calls after it.
  std::vector<std::string> env_strings;
  bool has_glog_level = false;
  for (char** e = environ; *e; ++e) {
    env_strings.emplace_back(*e);
    has_glog_level = has_glog_level || env_strings.back().starts_with("GLOG_minloglevel=");
  }
  if (!has_glog_level) env_strings.emplace_back("GLOG_minloglevel=1");  // Mooncake's warnings and errors, not its info lines
  std::vector<char*> envp;
  for (auto& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::string source = MooncakeHelperSource();
  std::string dash_c = "-c";
  std::vector<char*> argv = {python.data(), dash_c.data(), source.data(), fd_list.data(), nullptr};
  const pid_t parent = ::getpid();

  const pid_t pid = ::fork();
  if (pid < 0) {
    for (int fd : child_fds) ::close(fd);
    return Error(Errno("Mooncake helper: fork"));
  }
  if (pid == 0) {
    // Killed with hsx. The signal follows the forking *thread*: Connect runs on the thread
    // that owns the sink's lifetime (serve's and extract's main thread).
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    ::dup2(STDERR_FILENO, STDOUT_FILENO);  // extract's stdout is its manifest lines: Mooncake's output goes to stderr
    if (::getppid() != parent) ::_exit(1);
    for (int fd : child_fds) ::fcntl(fd, F_SETFD, 0);  // these, and only these, cross exec
    ::execve(argv[0], argv.data(), envp.data());
    ::_exit(127);
  }
  for (int fd : child_fds) ::close(fd);
  client->pid_ = pid;

  nlohmann::json setup = {{"op", "setup"},
                          {"local_hostname", config.local_hostname},
                          {"metadata_server", config.metadata_server},
                          {"global_segment_size", config.global_segment_size},
                          {"local_buffer_size", config.local_buffer_size},
                          {"protocol", config.protocol},
                          {"device_name", config.device_name},
                          {"master_server_address", config.master_server_address}};
  Channel& first = client->channels_[0];
  Status sent = SendAll(first.fd, setup.dump(), -1);
  auto reply = sent.ok() ? Receive(first.fd, options.setup_timeout_ms) : Result<nlohmann::json>(sent);
  if (!reply.ok()) {
    return Error("Mooncake helper (" + python + "): " + reply.status().message());
  }
  if (reply->value("missing", false)) {
    return Error("Mooncake is not installed for " + python + " (" + (*reply)["error"].get<std::string>() + "); " +
                 kInstallHint + ", or set HSX_PYTHON to a Python that has it");
  }
  if ((*reply)["status"].get<int64_t>() != 0) {
    return Error("MooncakeDistributedStore.setup with master " + config.master_server_address + " failed with " +
                 StatusText(*reply) + " (Mooncake's log above says why)");
  }
  for (int i = 0; i < config.num_writer_threads; ++i) client->free_.push_back(i);
  return client;
}

MooncakeClient::~MooncakeClient() {
  for (Channel& c : channels_) {
    if (c.fd >= 0) ::close(c.fd);  // the helper's channel 0 closes: it closes the store and exits
    if (c.map) ::munmap(c.map, c.capacity);
    if (c.memfd >= 0) ::close(c.memfd);
  }
  if (pid_ > 0) {
    for (int i = 0; i < 100; ++i) {  // Mooncake unmounts its segment from the master first
      if (::waitpid(pid_, nullptr, WNOHANG) == pid_) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
  }
}

int MooncakeClient::Acquire() {
  std::unique_lock lock(mu_);
  free_cv_.wait(lock, [&] { return !free_.empty(); });
  const int c = free_.back();
  free_.pop_back();
  return c;
}

void MooncakeClient::Release(int channel) {
  {
    std::lock_guard lock(mu_);
    free_.push_back(channel);
  }
  free_cv_.notify_one();
}

Status MooncakeClient::Broken(const std::string& why) {
  std::lock_guard lock(mu_);
  if (!broken_.empty()) return Error(broken_);
  broken_ = "the Mooncake helper (pid " + std::to_string(pid_) + ") ";
  // A reset channel is most often a helper that died: say how, once it is reaped.
  int st = 0;
  pid_t reaped = 0;
  for (int i = 0; i < 20 && reaped == 0; ++i) {
    reaped = ::waitpid(pid_, &st, WNOHANG);
    if (reaped == 0) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  if (reaped == pid_) {
    pid_ = -1;
    broken_ += WIFSIGNALED(st) ? "exited, killed by signal " + std::to_string(WTERMSIG(st))
                               : "exited with status " + std::to_string(WEXITSTATUS(st));
    broken_ += " (its log, above, says why); later puts fail until hsx restarts";
  } else {
    broken_ += why + "; later puts fail until hsx restarts";
  }
  return Error(broken_);
}

Result<nlohmann::json> MooncakeClient::Call(Channel& channel, const nlohmann::json& request, int memfd,
                                            int timeout_ms) {
  {
    std::lock_guard lock(mu_);
    if (!broken_.empty()) return Error(broken_);
  }
  Status sent = SendAll(channel.fd, request.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace), memfd);
  if (!sent.ok()) return Broken(sent.message());
  auto reply = Receive(channel.fd, timeout_ms);
  // A late answer would be taken for the next request's: the channel, and so the client, is done.
  if (!reply.ok()) return Broken(reply.status().message());
  return reply;
}

Status MooncakeClient::EnsureBuffer(Channel& channel, size_t nbytes) {
  if (channel.map && channel.capacity >= nbytes) return {};
  const size_t capacity = (std::max<size_t>(nbytes, 1) + kStagingGranule - 1) / kStagingGranule * kStagingGranule;
  const int memfd = ::memfd_create("hsx-mooncake-staging", MFD_CLOEXEC);
  if (memfd < 0) return Error(Errno("memfd_create"));
  if (::ftruncate(memfd, static_cast<off_t>(capacity)) != 0) {
    ::close(memfd);
    return Error(Errno("sizing a " + std::to_string(capacity) + "-byte staging buffer"));
  }
  void* map = ::mmap(nullptr, capacity, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0);
  if (map == MAP_FAILED) {
    ::close(memfd);
    return Error(Errno("mapping a " + std::to_string(capacity) + "-byte staging buffer"));
  }
  auto reply = Call(channel, {{"op", "buffer"}, {"size", capacity}}, memfd, options_.put_timeout_ms);
  if (channel.map) ::munmap(channel.map, channel.capacity);  // the helper has let go of the old one
  if (channel.memfd >= 0) ::close(channel.memfd);
  channel.map = map;
  channel.memfd = memfd;
  channel.capacity = capacity;
  if (!reply.ok()) return reply.status();
  if ((*reply)["status"].get<int64_t>() != 0) {
    channel.capacity = 0;  // registration failed: try again next time
    return Error("Mooncake register_buffer of " + std::to_string(capacity) + " bytes failed with " + StatusText(*reply));
  }
  return {};
}

Status MooncakeClient::PutWith(const std::string& key, size_t nbytes,
                               const std::function<void(std::span<std::byte>)>& fill) {
  const int c = Acquire();
  Channel& channel = channels_[c];
  Status status = EnsureBuffer(channel, nbytes);
  if (status.ok()) {
    fill(std::span<std::byte>(static_cast<std::byte*>(channel.map), nbytes));
    auto reply = Call(channel, {{"op", "put_from"}, {"key", key}, {"size", nbytes}}, -1, options_.put_timeout_ms);
    if (!reply.ok()) {
      status = reply.status();
    } else if ((*reply)["status"].get<int64_t>() != 0) {
      status = Error("Mooncake put_from of " + std::to_string(nbytes) + " bytes failed with " + StatusText(*reply));
    }
  }
  Release(c);
  return status.with_context("key '" + key + "'");
}

Status MooncakeClient::Put(const std::string& key, std::string_view bytes) {
  const int c = Acquire();
  auto reply = Call(channels_[c], {{"op", "put"}, {"key", key}, {"value", std::string(bytes)}}, -1,
                    options_.put_timeout_ms);
  Release(c);
  if (!reply.ok()) return reply.status().with_context("key '" + key + "'");
  if ((*reply)["status"].get<int64_t>() != 0) {
    return Error("Mooncake put failed with " + StatusText(*reply)).with_context("key '" + key + "'");
  }
  return {};
}

std::string MooncakeClient::Describe() const {
  // Where the objects live says what a crash of hsx takes (docs/DEPENDENCIES.md).
  const std::string segment = config_.global_segment_size > 0
                                  ? std::to_string(config_.global_segment_size >> 20) +
                                        " MiB segment here, whose objects die with hsx"
                                  : "no segment here: objects go to other clients' segments and outlive hsx";
  return "Mooncake store (master " + config_.master_server_address + ", " + config_.protocol + ", " + segment + ", " +
         std::to_string(config_.num_writer_threads) + " writers)";
}

}  // namespace hsx
