// The Mooncake store as an ObjectStore. The PyPI wheels ship Mooncake as Python bindings
// (mooncake.store) and binaries, with no C++ headers, so hsx drives MooncakeDistributedStore
// through a helper process: the Python found at run time (HSX_PYTHON, else python3 on PATH)
// runs mooncake_helper.py, one SOCK_SEQPACKET channel per writer thread. Each channel has a
// staging buffer (a memfd both processes map, registered with Mooncake), so an object is
// packed once, by hsx, into memory put_from reads from. Why not embedded CPython:
// docs/DEPENDENCIES.md.
#pragma once

#include <sys/types.h>

#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "capture/mooncake_config.h"
#include "capture/object_store.h"

namespace hsx {

class MooncakeClient final : public ObjectStore {
 public:
  struct Options {
    int probe_timeout_ms = 3000;    // connecting to the master before anything starts
    int setup_timeout_ms = 120000;  // MooncakeDistributedStore.setup
    int put_timeout_ms = 120000;    // one put_from or put
  };
  // Probes the master, starts the helper and sets the store up; errors say what is missing
  // (a Python, the mooncake package, a master) and how to get it.
  static Result<std::unique_ptr<MooncakeClient>> Connect(const MooncakeConfig& config, const Options& options);
  static Result<std::unique_ptr<MooncakeClient>> Connect(const MooncakeConfig& config) {
    return Connect(config, Options{});
  }
  ~MooncakeClient() override;

  Status PutWith(const std::string& key, size_t nbytes,
                 const std::function<void(std::span<std::byte>)>& fill) override;
  Status Put(const std::string& key, std::string_view bytes) override;
  std::string Describe() const override;

 private:
  struct Channel {
    int fd = -1;
    int memfd = -1;
    void* map = nullptr;
    size_t capacity = 0;
  };
  MooncakeClient(MooncakeConfig config, Options options) : config_(std::move(config)), options_(options) {}
  int Acquire();
  void Release(int channel);
  Status EnsureBuffer(Channel& channel, size_t nbytes);
  // One request, one reply; a helper that dies or stops answering breaks the client.
  Result<nlohmann::json> Call(Channel& channel, const nlohmann::json& request, int memfd, int timeout_ms);
  Status Broken(const std::string& why);

  MooncakeConfig config_;
  Options options_;
  pid_t pid_ = -1;
  std::vector<Channel> channels_;
  std::mutex mu_;
  std::condition_variable free_cv_;
  std::vector<int> free_;
  std::string broken_;  // set once: every later put fails with it
};

}  // namespace hsx
