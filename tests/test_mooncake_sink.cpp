// The Mooncake capture sink without a store: hs_connectors' key rule, packed layout and
// manifest, error marker, config checks, and the clear errors of a missing Mooncake.
// tests/python/test_mooncake_sink.py reads what it puts with hs_connectors' own reader.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <sys/stat.h>

#include "capture/mooncake_client.h"
#include "capture/mooncake_config.h"
#include "capture/mooncake_object.h"
#include "capture/mooncake_sink.h"

namespace hsx {
namespace {

// A map behind the ObjectStore interface; fails puts whose key is in `refuse`.
class FakeStore : public ObjectStore {
 public:
  Status PutWith(const std::string& key, size_t nbytes, const std::function<void(std::span<std::byte>)>& fill) override {
    std::string bytes(nbytes, '\x5a');  // not zero: the packer must clear padding itself
    fill(std::span<std::byte>(reinterpret_cast<std::byte*>(bytes.data()), nbytes));
    if (refuse.count(key)) return Error("Mooncake put_from failed with status -200");
    std::lock_guard lock(mu);
    objects[key] = std::move(bytes);
    return {};
  }
  Status Put(const std::string& key, std::string_view bytes) override {
    if (refuse.count(key)) return Error("Mooncake put failed with status -900");
    std::lock_guard lock(mu);
    objects[key] = std::string(bytes);
    return {};
  }
  std::string Describe() const override { return "fake store"; }
  std::mutex mu;
  std::map<std::string, std::string> objects;
  std::set<std::string> refuse;
};

CaptureRecord MakeRecord(const std::string& id, int64_t t, int64_t l, int64_t h) {
  CaptureRecord r;
  r.id = id;
  r.hidden_states = Tensor::Host(DType::kBF16, {t, l, h});
  for (int64_t i = 0; i < t * l * h; ++i) r.hidden_states.data<uint16_t>()[i] = static_cast<uint16_t>(0x3f80 + i);
  for (int64_t i = 0; i < t; ++i) r.token_ids.push_back(static_cast<int32_t>(1000 + i));
  r.metadata["layer_ids"] = "[1, 3]";
  return r;
}

TEST(MooncakeObject, KeysFollowHsConnectorsSanitizeKey) {
  // Expected values from hs_connectors' sanitize_key (Python's re.sub over code points).
  EXPECT_EQ(SanitizeMooncakeKey("cmpl-abc_1"), "cmpl-abc_1");
  EXPECT_EQ(SanitizeMooncakeKey("42"), "k42");
  EXPECT_EQ(SanitizeMooncakeKey("a/b.c:d"), "a_b_c_d");
  EXPECT_EQ(SanitizeMooncakeKey("h\xc3\xa9llo w\xc3\xb6rld"), "h_llo_w_rld");
  EXPECT_EQ(SanitizeMooncakeKey("9-x"), "k9-x");
  EXPECT_EQ(SanitizeMooncakeKey("\xe6\x97\xa5\xe6\x9c\xac"), "__");
  EXPECT_EQ(SanitizeMooncakeKey("a\xf0\x9f\x98\x80" "b"), "a_b");
  EXPECT_EQ(SanitizeMooncakeKey("k1"), "k1");
}

TEST(MooncakeObject, ManifestMatchesPackedLayout) {
  CaptureRecord r = MakeRecord("req/1", 3, 2, 5);  // hidden_states: 60 bytes; token_ids: 24
  auto obj = PlanMooncakeObject(r);
  ASSERT_TRUE(obj.ok()) << obj.status().message();
  const nlohmann::json& m = obj->manifest;
  EXPECT_EQ(m["handle"], "req_1");
  EXPECT_EQ(m["version"], 1);
  EXPECT_EQ(m["tensors"]["hidden_states"],
            (nlohmann::json{{"shape", {3, 2, 5}}, {"dtype", "torch.bfloat16"}, {"nbytes", 60}, {"offset", 0}}));
  EXPECT_EQ(m["tensors"]["token_ids"],
            (nlohmann::json{{"shape", {3}}, {"dtype", "torch.int64"}, {"nbytes", 24}, {"offset", 64}}));
  EXPECT_EQ(m["metadata"]["total_aligned_bytes"], 128);
  EXPECT_EQ(m["metadata"]["num_tokens"], 3);
  EXPECT_EQ(m["metadata"]["extract_mode"], "prompt_only");
  EXPECT_EQ(m["metadata"]["layer_ids"], "[1, 3]");
  // Insertion order is the reader's iteration order only by name; offsets are what count.
  EXPECT_EQ(obj->total_bytes, 128u);
}

TEST(MooncakeObject, PackPutsEachTensorAtItsOffsetAndClearsPadding) {
  CaptureRecord r = MakeRecord("a", 3, 2, 5);
  Tensor mask = Tensor::Host(DType::kI64, {3});
  for (int i = 0; i < 3; ++i) mask.data<int64_t>()[i] = i % 2;
  r.extras.push_back({"loss_mask", mask});
  FakeStore store;
  auto obj = PlanMooncakeObject(r);
  ASSERT_TRUE(obj.ok());
  EXPECT_EQ(obj->manifest["tensors"]["loss_mask"]["offset"], 128);
  EXPECT_EQ(obj->total_bytes, 192u);
  std::string bytes(obj->total_bytes, '\x5a');
  PackMooncakeObject(*obj, std::span<std::byte>(reinterpret_cast<std::byte*>(bytes.data()), bytes.size()));
  EXPECT_EQ(0, std::memcmp(bytes.data(), r.hidden_states.raw(), 60));
  EXPECT_EQ(bytes.substr(60, 4), std::string(4, '\0'));
  for (int i = 0; i < 3; ++i) {
    int64_t v;
    std::memcpy(&v, bytes.data() + 64 + 8 * i, 8);
    EXPECT_EQ(v, 1000 + i);
  }
  EXPECT_EQ(bytes.substr(88, 40), std::string(40, '\0'));
  EXPECT_EQ(0, std::memcmp(bytes.data() + 128, mask.raw(), 24));
  EXPECT_EQ(bytes.substr(152), std::string(40, '\0'));
}

TEST(MooncakeObject, RejectsRecordsThatDoNotAddUp) {
  CaptureRecord r = MakeRecord("bad", 3, 2, 5);
  r.token_ids.pop_back();
  auto obj = PlanMooncakeObject(r);
  ASSERT_FALSE(obj.ok());
  EXPECT_NE(obj.status().message().find("request 'bad'"), std::string::npos);
  CaptureRecord dup = MakeRecord("dup", 1, 1, 1);
  dup.extras.push_back({"token_ids", Tensor::Host(DType::kI64, {1})});
  EXPECT_FALSE(PlanMooncakeObject(dup).ok());
}

TEST(MooncakeObject, ErrorMarkerIsPutErrorsJson) {
  auto marker = nlohmann::json::parse(MooncakeErrorMarker("non-finite \"state\" at layer 3"));
  EXPECT_EQ(marker, (nlohmann::json{{"error", "non-finite \"state\" at layer 3"}}));
  std::string long_text;
  for (int i = 0; i < 5000; ++i) long_text += "\xc3\xa9";  // 5000 code points, 10000 bytes
  auto cut = nlohmann::json::parse(MooncakeErrorMarker(long_text));
  EXPECT_EQ(cut["error"].get<std::string>().size(), 8192u);  // error[:4096], in code points
}

TEST(MooncakeSink, PutReturnsTheManifestAndStoresTheObject) {
  auto store = std::make_unique<FakeStore>();
  FakeStore* fake = store.get();
  MooncakeSink sink(std::move(store));
  CaptureRecord r = MakeRecord("7", 2, 1, 4);
  auto receipt = sink.Put(r);
  ASSERT_TRUE(receipt.ok()) << receipt.status().message();
  EXPECT_EQ(receipt->location, "k7");
  EXPECT_EQ(receipt->transfer_params["handle"], "k7");
  ASSERT_EQ(fake->objects.count("k7"), 1u);
  EXPECT_EQ(fake->objects["k7"].size(), receipt->transfer_params["metadata"]["total_aligned_bytes"].get<size_t>());
  EXPECT_EQ(receipt->bytes, fake->objects["k7"].size());  // what bench counts as bytes moved
  EXPECT_EQ(fake->objects.count("k7:error"), 0u);
}

TEST(MooncakeSink, FailureTransferParamsAreTheManifestAReaderWaitsWith) {
  MooncakeSink sink(std::make_unique<FakeStore>());
  CaptureRecord r = MakeRecord("a/b", 3, 2, 4);
  EXPECT_EQ(sink.FailureTransferParams(r), PlanMooncakeObject(r)->manifest);
  // A request that failed before any state was captured: its handle, no tensors.
  CaptureRecord empty;
  empty.id = "9x";
  empty.metadata["extract_mode"] = "all";
  const nlohmann::json params = sink.FailureTransferParams(empty);
  EXPECT_EQ(params["handle"], "k9x");
  EXPECT_EQ(params["version"], kMooncakeManifestVersion);
  EXPECT_TRUE(params["tensors"].empty());
  EXPECT_EQ(params["metadata"]["total_aligned_bytes"], 0);
  EXPECT_EQ(params["metadata"]["extract_mode"], "all");
}

TEST(MooncakeSink, AMarkerThatCannotBeWrittenIsReported) {
  auto store = std::make_unique<FakeStore>();
  FakeStore* fake = store.get();
  fake->refuse = {"down", "down:error", "gone:error"};
  MooncakeSink sink(std::move(store));
  auto receipt = sink.Put(MakeRecord("down", 2, 1, 4));
  ASSERT_FALSE(receipt.ok());
  const std::string& m = receipt.status().message();
  EXPECT_NE(m.find("-200"), std::string::npos) << m;  // why the put failed
  EXPECT_NE(m.find("error marker 'down:error' could not be written either"), std::string::npos) << m;
  EXPECT_NE(m.find("-900"), std::string::npos) << m;  // and why the marker did
  Status failure = sink.PutFailure(MakeRecord("gone", 1, 1, 1), Error("engine failed"));
  ASSERT_FALSE(failure.ok());
  EXPECT_NE(failure.message().find("'gone:error'"), std::string::npos);
  EXPECT_TRUE(sink.PutFailure(MakeRecord("fine", 1, 1, 1), Error("engine failed")).ok());
  EXPECT_EQ(fake->objects.count("fine:error"), 1u);
}

TEST(MooncakeSink, AFailedPutLeavesTheErrorMarker) {
  auto store = std::make_unique<FakeStore>();
  FakeStore* fake = store.get();
  fake->refuse.insert("full");
  MooncakeSink sink(std::move(store));
  auto receipt = sink.Put(MakeRecord("full", 2, 1, 4));
  ASSERT_FALSE(receipt.ok());
  EXPECT_NE(receipt.status().message().find("request 'full'"), std::string::npos);
  EXPECT_EQ(fake->objects.count("full"), 0u);
  ASSERT_EQ(fake->objects.count("full:error"), 1u);
  auto marker = nlohmann::json::parse(fake->objects["full:error"]);
  EXPECT_NE(marker["error"].get<std::string>().find("-200"), std::string::npos);
  // The next request goes on.
  EXPECT_TRUE(sink.Put(MakeRecord("next", 2, 1, 4)).ok());
  EXPECT_TRUE(sink.PutFailure(MakeRecord("x.y", 1, 1, 1), Error("non-finite hidden state")).ok());
  EXPECT_EQ(nlohmann::json::parse(fake->objects["x_y:error"])["error"], "non-finite hidden state");
}

TEST(MooncakeConfig, ReadsHsConnectorsConfig) {
  // As MooncakeBackend.build_kv_transfer_config writes it (dataclasses.asdict).
  auto c = ParseMooncakeConfig(nlohmann::json::parse(R"({"local_hostname": "10.0.0.5", "metadata_server": "P2PHANDSHAKE",
      "master_server_address": "10.0.0.1:50051", "global_segment_size": 4294967296, "local_buffer_size": 2147483648,
      "protocol": "tcp", "device_name": "", "num_writer_threads": 4})"));
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->local_hostname, "10.0.0.5");
  EXPECT_EQ(c->global_segment_size, int64_t{4} << 30);
  EXPECT_EQ(c->num_writer_threads, 4);
  auto defaults = ParseMooncakeConfig(nlohmann::json::object());
  ASSERT_TRUE(defaults.ok());
  EXPECT_EQ(defaults->master_server_address, "127.0.0.1:50051");
}

TEST(MooncakeConfig, ErrorsNameTheField) {
  auto expect_error = [](const std::string& text, const std::string& field) {
    auto c = ParseMooncakeConfig(nlohmann::json::parse(text));
    ASSERT_FALSE(c.ok()) << text;
    EXPECT_NE(c.status().message().find(field), std::string::npos) << c.status().message();
  };
  expect_error(R"({"global_segment_size": "4GB"})", "mooncake.global_segment_size");
  expect_error(R"({"global_segment_size": -1})", "mooncake.global_segment_size");
  expect_error(R"({"num_writer_threads": 0})", "mooncake.num_writer_threads");
  expect_error(R"({"num_writer_threads": 2.5})", "mooncake.num_writer_threads");
  expect_error(R"({"local_hostname": 5})", "mooncake.local_hostname");
  expect_error(R"({"protocol": "udp"})", "mooncake.protocol");
  expect_error(R"({"master_server_address": "localhost"})", "mooncake.master_server_address");
  expect_error(R"({"master_address": "localhost:1"})", "mooncake.master_address");
  expect_error(R"("127.0.0.1:50051")", "kv_connector_extra_config.mooncake");
}

// A port nothing listens on: bound, never listened to.
int ClosedPort(int* fd) {
  *fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(*fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  socklen_t len = sizeof(a);
  ::getsockname(*fd, reinterpret_cast<sockaddr*>(&a), &len);
  return ntohs(a.sin_port);
}

TEST(MooncakeClient, AMasterThatIsDownIsAClearErrorAtOnce) {
  int fd;
  const int port = ClosedPort(&fd);
  MooncakeConfig c;
  c.master_server_address = "127.0.0.1:" + std::to_string(port);
  const auto start = std::chrono::steady_clock::now();
  auto client = MooncakeClient::Connect(c);
  ::close(fd);
  ASSERT_FALSE(client.ok());
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
  EXPECT_NE(client.status().message().find("not reachable"), std::string::npos) << client.status().message();
  EXPECT_NE(client.status().message().find("mooncake_master"), std::string::npos);
}

// A listening socket stands in for the master so that the probe passes.
struct FakeMaster {
  FakeMaster() {
    port = ClosedPort(&fd);
    ::listen(fd, 4);
  }
  ~FakeMaster() { ::close(fd); }
  int fd;
  int port;
};

struct ScopedEnv {
  ScopedEnv(const char* name, const std::string& value) : name(name) {
    if (const char* old = std::getenv(name)) saved = old;
    ::setenv(name, value.c_str(), 1);
  }
  ~ScopedEnv() { saved ? ::setenv(name, saved->c_str(), 1) : ::unsetenv(name); }
  const char* name;
  std::optional<std::string> saved;
};

TEST(MooncakeClient, NoPythonIsAClearError) {
  FakeMaster master;
  MooncakeConfig c;
  c.master_server_address = "127.0.0.1:" + std::to_string(master.port);
  ScopedEnv env("HSX_PYTHON", "/nonexistent/python3");
  auto client = MooncakeClient::Connect(c);
  ASSERT_FALSE(client.ok());
  EXPECT_NE(client.status().message().find("HSX_PYTHON=/nonexistent/python3"), std::string::npos)
      << client.status().message();
}

TEST(MooncakeClient, APythonWithoutMooncakeIsAClearError) {
  if (std::system("command -v python3 >/dev/null 2>&1") != 0) GTEST_SKIP() << "no python3 on PATH";
  FakeMaster master;
  MooncakeConfig c;
  c.master_server_address = "127.0.0.1:" + std::to_string(master.port);
  // python3 -S: no site-packages, so no mooncake, whatever this machine has installed.
  const std::string script = ::testing::TempDir() + "/python_without_site";
  std::ofstream(script) << "#!/bin/sh\nexec python3 -S \"$@\"\n";
  ::chmod(script.c_str(), 0755);
  ScopedEnv env("HSX_PYTHON", script);
  auto client = MooncakeClient::Connect(c);
  ASSERT_FALSE(client.ok());
  const std::string& msg = client.status().message();
  EXPECT_NE(msg.find("Mooncake is not installed"), std::string::npos) << msg;
  EXPECT_NE(msg.find("mooncake-transfer-engine"), std::string::npos) << msg;
  EXPECT_NE(msg.find("mooncake"), std::string::npos) << msg;
}

TEST(MooncakeSinkFactory, ConfigErrorsComeBeforeConnecting) {
  auto sink = MakeMooncakeSink(nlohmann::json{{"protocol", 1}});
  ASSERT_FALSE(sink.ok());
  EXPECT_NE(sink.status().message().find("mooncake.protocol"), std::string::npos);
}

}  // namespace
}  // namespace hsx
