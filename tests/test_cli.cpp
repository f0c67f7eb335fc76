// The hsx binary end to end: extract writes files that read back as the goldens,
// resumes from its manifest, and turns every kind of bad input into a one-line error
// that names the line, while the good requests still finish.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <set>

#include "test_util.h"
#include "util/atomic_file.h"

namespace hsx {
namespace {

namespace fs = std::filesystem;

struct CommandResult {
  int exit_code;
  std::string out, err;
};

std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

class CliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/hsx-cli-test-XXXXXX";
    dir_ = mkdtemp(tmpl);
  }
  void TearDown() override { fs::remove_all(dir_); }

  CommandResult Hsx(const std::string& args) {
    const std::string out = dir_ + "/stdout", err = dir_ + "/stderr";
    const int status = std::system((std::string(HSX_BINARY) + " " + args + " >" + out + " 2>" + err).c_str());
    return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, Slurp(out), Slurp(err)};
  }

  std::string WriteLines(const std::string& name, const std::vector<std::string>& lines) {
    const std::string path = dir_ + "/" + name;
    std::ofstream f(path);
    for (const auto& l : lines) f << l << "\n";
    return path;
  }

  std::string GoldenPrompts(const SafetensorsFile& golden) {
    std::vector<std::string> lines;
    for (int k = 0; k < 3; ++k) {
      lines.push_back(nlohmann::json{{"id", "p" + std::to_string(k)},
                                     {"token_ids", test::AsIds(golden.Get("prompt_" + std::to_string(k)).value())}}
                          .dump());
    }
    return WriteLines("prompts.jsonl", lines);
  }

  std::string dir_;
};

TEST_F(CliTest, ExtractRoundTripMatchesGoldenForEveryModel) {
  for (const std::string& name : test::FixtureModels()) {
    SCOPED_TRACE(name);
    SafetensorsFile golden = test::Golden(test::ModelDir(name) + "/golden.safetensors");
    const int64_t layers_total = golden.Get("hidden_0")->size(1), h = golden.Get("hidden_0")->size(2);
    const int n = static_cast<int>(layers_total) - 1;
    const std::vector<int> layers = {0, 2, n};
    const std::string out = dir_ + "/out-" + name;
    CommandResult r = Hsx("extract --model " + test::ModelDir(name) + " --layers " + std::to_string(n) + ",0,2 --input " +
                          GoldenPrompts(golden) + " --output " + out + " --dtype float32 --max-num-batched-tokens 64");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    for (int k = 0; k < 3; ++k) {
      auto file = SafetensorsFile::Open(out + "/p" + std::to_string(k) + ".safetensors");
      ASSERT_TRUE(file.ok()) << file.status().message();
      const Tensor hs = file->Get("hidden_states").value(), ids = file->Get("token_ids").value();
      const Tensor gold = golden.Get("hidden_" + std::to_string(k)).value();
      const int64_t t = gold.size(0);
      ASSERT_EQ(hs.shape(), (Shape{t, 3, h}));
      EXPECT_EQ(hs.dtype(), DType::kF32);
      EXPECT_EQ(ids.dtype(), DType::kI64);
      EXPECT_EQ(test::AsIds(ids), test::AsIds(golden.Get("prompt_" + std::to_string(k)).value()));
      std::vector<float> mine = test::AsFloats(hs), ref;
      const std::vector<float> all = test::AsFloats(gold);
      for (int64_t i = 0; i < t; ++i)
        for (int l : layers) ref.insert(ref.end(), all.begin() + (i * layers_total + l) * h, all.begin() + (i * layers_total + l + 1) * h);
      EXPECT_LE(test::RelativeMaxError(mine, ref), 1e-4) << "prompt " << k;
    }
    // The manifest lists each file once, with its absolute path and token count.
    std::ifstream manifest(out + "/manifest.jsonl");
    std::string line;
    int lines = 0;
    while (std::getline(manifest, line)) {
      const auto j = nlohmann::json::parse(line);
      EXPECT_TRUE(fs::path(j["path"].get<std::string>()).is_absolute());
      EXPECT_TRUE(fs::exists(j["path"].get<std::string>()));
      ++lines;
    }
    EXPECT_EQ(lines, 3);
  }
}

TEST_F(CliTest, ExtractDefaultsToCheckpointDtypeAndResumes) {
  SafetensorsFile golden = test::Golden(test::ModelDir("llama") + "/golden.safetensors");
  const std::string prompts = GoldenPrompts(golden), out = dir_ + "/out";
  const std::string args = "extract --model " + test::ModelDir("llama") + " --layers 1,4 --input " + prompts + " --output " + out;
  CommandResult first = Hsx(args);
  ASSERT_EQ(first.exit_code, 0) << first.err;
  auto file = SafetensorsFile::Open(out + "/p2.safetensors");
  ASSERT_TRUE(file.ok());
  EXPECT_EQ(file->Get("hidden_states")->dtype(), DType::kBF16);
  // bf16 storage of f32 states: relative error within bf16 rounding.
  const std::vector<float> all = test::AsFloats(golden.Get("hidden_2").value());
  std::vector<float> ref;
  for (int64_t i = 0; i < 130; ++i)
    for (int l : {1, 4}) ref.insert(ref.end(), all.begin() + (i * 5 + l) * 64, all.begin() + (i * 5 + l + 1) * 64);
  EXPECT_LE(test::RelativeMaxError(test::AsFloats(file->Get("hidden_states").value()), ref), 8e-3);

  const auto mtime = fs::last_write_time(out + "/p2.safetensors");
  CommandResult second = Hsx(args);
  EXPECT_EQ(second.exit_code, 0) << second.err;
  EXPECT_NE(second.err.find("wrote 0 files"), std::string::npos) << second.err;
  EXPECT_NE(second.err.find("skipped 3 already in the manifest"), std::string::npos) << second.err;
  EXPECT_EQ(fs::last_write_time(out + "/p2.safetensors"), mtime);
}

// What a killed or failed run left: a torn manifest line and a temp file. The resumed run
// cuts the line off, removes the dead run's temp file, and lists every id exactly once.
TEST_F(CliTest, ExtractResumesOverATornManifestAndLeftoverTempFiles) {
  SafetensorsFile golden = test::Golden(test::ModelDir("llama") + "/golden.safetensors");
  const std::string prompts = GoldenPrompts(golden), out = dir_ + "/out";
  const std::string args = "extract --model " + test::ModelDir("llama") + " --layers 1,4 --input " + prompts + " --output " + out;
  CommandResult first = Hsx(args);
  ASSERT_EQ(first.exit_code, 0) << first.err;
  // As if p1's and p2's appends failed midway and a run was killed before its rename.
  std::vector<std::string> lines;
  {
    std::ifstream in(out + "/manifest.jsonl");
    for (std::string l; std::getline(in, l);) lines.push_back(l);
  }
  ASSERT_EQ(lines.size(), 3u);
  std::string p0_line;
  for (const auto& l : lines)
    if (l.find("\"p0\"") != std::string::npos) p0_line = l;
  std::ofstream(out + "/manifest.jsonl", std::ios::trunc) << p0_line << "\n" << lines[0].substr(0, 12);
  const pid_t dead = fork();
  if (dead == 0) _exit(0);
  waitpid(dead, nullptr, 0);
  const std::string leftover = out + "/p1.safetensors.tmp." + TempFileHost() + "." + std::to_string(dead) + ".3";
  fs::copy_file(out + "/p1.safetensors", leftover);

  CommandResult second = Hsx(args);
  EXPECT_EQ(second.exit_code, 0) << second.err;
  EXPECT_NE(second.err.find("manifest.jsonl:2: incomplete last line"), std::string::npos) << second.err;
  EXPECT_NE(second.err.find("removed 1 temp file(s)"), std::string::npos) << second.err;
  EXPECT_NE(second.err.find("wrote 2 files"), std::string::npos) << second.err;
  EXPECT_FALSE(fs::exists(leftover));
  std::multiset<std::string> ids;
  std::ifstream in(out + "/manifest.jsonl");
  for (std::string l; std::getline(in, l);) {
    auto j = nlohmann::json::parse(l, nullptr, false);
    ASSERT_TRUE(j.is_object()) << "unparsable manifest line: " << l;
    ids.insert(j["id"].get<std::string>());
  }
  EXPECT_EQ(ids, (std::multiset<std::string>{"p0", "p1", "p2"}));
}

// A copy of the qwen3 fixture whose weights `poison` edits in place (bf16 bytes).
std::string PoisonedModel(const std::string& dir, const std::function<void(const std::string&, Tensor&)>& poison) {
  fs::create_directories(dir);
  fs::copy_file(test::ModelDir("qwen3") + "/config.json", dir + "/config.json");
  SafetensorsFile original = test::Golden(test::ModelDir("qwen3") + "/model.safetensors");
  std::vector<NamedTensor> tensors;
  for (const auto& [name, t] : original.tensors()) {
    Tensor copy = Tensor::Host(t.dtype(), t.shape());
    std::memcpy(copy.raw(), t.raw(), t.nbytes());
    poison(name, copy);
    tensors.push_back({name, copy});
  }
  EXPECT_TRUE(WriteSafetensors(dir + "/model.safetensors", tensors).ok());
  return dir;
}

constexpr uint16_t kBf16Inf = 0x7f80;  // the exponent byte all ones: what a flipped byte can make

TEST_F(CliTest, NonFiniteHiddenStatesFailTheirRequestAloneAndWriteNoFile) {
  const std::string prompts = WriteLines("p.jsonl", {R"({"id": "clean", "token_ids": [1, 2, 3, 4, 5]})",
                                                     R"({"id": "poisoned", "token_ids": [1, 2, 3, 7, 5]})"});
  // Token 7's embedding is inf: the prompt holding it fails at layer 0, position 3; the
  // other prompt in the same batch is written.
  const std::string embed = PoisonedModel(dir_ + "/embed", [](const std::string& name, Tensor& t) {
    if (name == "model.embed_tokens.weight") std::fill_n(t.data<uint16_t>() + 7 * t.size(1), t.size(1), kBf16Inf);
  });
  CommandResult r = Hsx("extract --model " + embed + " --layers 0,2,4 --input " + prompts + " --output " + dir_ + "/o1");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("p.jsonl:2: request 'poisoned': the hidden state of layer 0 at token position 3 is not finite"),
            std::string::npos)
      << r.err;
  EXPECT_TRUE(fs::exists(dir_ + "/o1/clean.safetensors"));
  EXPECT_FALSE(fs::exists(dir_ + "/o1/poisoned.safetensors"));
  EXPECT_EQ(Slurp(dir_ + "/o1/manifest.jsonl").find("poisoned"), std::string::npos);
  // Layer 1's MLP overflows: states from layer 2 on are non-finite, layer 1's are not.
  const std::string mlp = PoisonedModel(dir_ + "/mlp", [](const std::string& name, Tensor& t) {
    if (name == "model.layers.1.mlp.down_proj.weight") std::fill_n(t.data<uint16_t>(), t.numel(), kBf16Inf);
  });
  r = Hsx("extract --model " + mlp + " --layers 1,2,4 --input " + prompts + " --output " + dir_ + "/o2");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("p.jsonl:1: request 'clean': the hidden state of layer 2 at token position 0 is not finite"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("wrote 0 files"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(dir_ + "/o2/clean.safetensors"));
}

TEST_F(CliTest, BenchRefusesADirectoryItDidNotMake) {
  const std::string precious = dir_ + "/precious";
  fs::create_directories(precious + "/out");
  std::ofstream(precious + "/notes.txt") << "keep me";
  std::ofstream(precious + "/out/data.bin") << "keep me too";
  const std::string bench = "bench --model " + test::ModelDir("qwen3") +
                            " --num-prompts 2 --median-len 8 --min-len 4 --max-len 16 --max-num-batched-tokens 64 --dir ";
  CommandResult r = Hsx(bench + precious);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("--dir " + precious + ": not empty and not made by hsx bench"), std::string::npos) << r.err;
  EXPECT_EQ(Slurp(precious + "/notes.txt"), "keep me");
  EXPECT_EQ(Slurp(precious + "/out/data.bin"), "keep me too");
  // A new directory is bench's own, and so is the same directory the next time.
  for (int run = 0; run < 2; ++run) {
    r = Hsx(bench + dir_ + "/scratch");
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_TRUE(fs::exists(dir_ + "/scratch/prompts.jsonl"));
  }
}

// A CPU bench measures the backend's GEMM library and any other found, and names the best
// of them as its baseline: the fraction is of that best, not of the linked one.
TEST_F(CliTest, BenchComparesWithTheBestGemmLibraryItFound) {
  CommandResult r = Hsx("bench --model " + test::ModelDir("qwen3") +
                        " --num-prompts 2 --median-len 8 --min-len 4 --max-len 16 --max-num-batched-tokens 64");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::map<std::string, double> gemms;
  std::string linked;
  nlohmann::json fraction;
  std::istringstream lines(r.out);
  for (std::string line; std::getline(lines, line);) {
    const nlohmann::json j = nlohmann::json::parse(line);
    if (j["metric"] == "gemm_gflops") {
      gemms[j["library"]] = j["value"];
      if (j["linked"]) linked = j["library"];
    }
    if (j["metric"] == "fraction_of_best_gemm") fraction = j;
  }
  ASSERT_FALSE(linked.empty()) << r.out;
  ASSERT_TRUE(fraction.is_object()) << r.out;
  EXPECT_EQ(fraction["linked_gemm"], linked);
  const std::string best = fraction["best_gemm"];
  ASSERT_TRUE(gemms.count(best)) << best;
  for (const auto& [library, gflops] : gemms) {
    EXPECT_GT(gflops, 0.0) << library;
    EXPECT_LE(gflops, gemms[best]) << library << " beats the named best " << best;
  }
}

// The decode bench on the fixture: one JSON line per batch size with every token generated,
// and sizes it cannot run refused by name before any work.
TEST_F(CliTest, DecodeBenchReportsEachBatchAndRefusesEmptyOnes) {
  const std::string bench = "bench --decode --model " + test::ModelDir("qwen3") + " --prompt-len 8 --new-tokens 5 --kv-cache-gib 0.05";
  CommandResult r = Hsx(bench + " --batch-sizes 1,3");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::istringstream lines(r.out);
  std::vector<int> batches;
  for (std::string line; std::getline(lines, line);) {
    const auto j = nlohmann::json::parse(line);
    batches.push_back(j.at("batch").get<int>());
    EXPECT_EQ(j.at("new_tokens").get<int>(), 5);
    EXPECT_GT(j.at("value").get<double>(), 0.0);
    EXPECT_GT(j.at("end_to_end_tokens_per_s").get<double>(), 0.0);
    EXPECT_LT(j.at("end_to_end_tokens_per_s").get<double>(), 1e9);
  }
  EXPECT_EQ(batches, (std::vector<int>{1, 3}));
  for (const char* bad : {" --batch-sizes 0", " --batch-sizes 2,-1", " --prompt-len 0", " --new-tokens 0"}) {
    r = Hsx(bench + bad);
    EXPECT_NE(r.exit_code, 0) << bad;
    EXPECT_NE(r.err.find(std::string(bad).substr(1, std::string(bad).find(' ', 1) - 1)), std::string::npos)
        << bad << ": " << r.err;
  }
}

// The decode bench's bound counts the weights in the bytes they are stored in: with
// --quantization fp8 the projections' one-byte codes and row scales, fewer than unquantized;
// an FP8 checkpoint of the same model (tests/data/fp8) as many, and says it is one.
TEST_F(CliTest, DecodeBenchCountsTheFp8WeightsBytes) {
  const std::string args = " --prompt-len 8 --new-tokens 2 --kv-cache-gib 0.05 --batch-sizes 1";
  const std::string bench = "bench --decode --model " + test::ModelDir("qwen3") + args;
  double bytes[3] = {0, 0, 0};
  const char* labels[3] = {"none", "fp8", "fp8 (checkpoint)"};
  for (int run : {0, 1, 2}) {
    CommandResult r = Hsx(run == 2 ? "bench --decode --model " + test::DataPath("fp8/qwen3_fp8_dynamic") + args
                                   : bench + (run == 1 ? " --quantization fp8" : ""));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const auto j = nlohmann::json::parse(r.out);  // one batch size: one line
    EXPECT_EQ(j.at("quantization"), labels[run]);
    bytes[run] = j.at("weight_bytes_per_step").get<double>();
  }
  EXPECT_GT(bytes[1], 0.0);
  EXPECT_LT(bytes[1], bytes[0]);
  EXPECT_EQ(bytes[2], bytes[1]);
}

// --spec-bench-accept-rate 1 on the decode bench: every draft accepted, even the random
// EAGLE-3 draft's (never accepted by verification), so with 9 tokens at K = 3 each sequence
// verifies twice and the mean acceptance length is K + 1; the JSON says the rate was forced.
// Refused without --decode, without a speculative config, outside [0, 1] and elsewhere.
// With "draft_length": "adaptive" the decode bench reports what the policy chose by: the
// request-steps at each K (0..K_max) and the cost model's figures in ms (on the CPU, eager
// steps only); with a fixed K, none.
TEST_F(CliTest, DecodeBenchReportsTheAdaptivePolicysFigures) {
  const std::string bench = "bench --decode --model " + test::ModelDir("llama") +
                            " --prompt-len 8 --new-tokens 40 --kv-cache-gib 0.05 --batch-sizes 2 --spec-bench-accept-rate 1";
  const auto spec = [](const std::string& length) {
    return " --speculative-config '{\"method\": \"eagle3\", \"model\": \"" + test::DataPath("eagle3/llama_legacy") +
           "\", \"num_speculative_tokens\": 3, \"draft_length\": \"" + length + "\"}'";
  };
  CommandResult r = Hsx(bench + spec("adaptive"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out.substr(0, r.out.find('\n')));
  ASSERT_TRUE(j.contains("draft_length")) << r.out;
  const auto counts = j.at("draft_length").at("request_steps_by_k").get<std::vector<int64_t>>();
  ASSERT_EQ(counts.size(), 4u) << r.out;
  // Which K wins depends on this machine's measured step costs (on the CPU a draft step
  // costs about what a target step does): some request-steps drafted, and all are counted.
  EXPECT_GT(counts[1] + counts[2] + counts[3], 0) << r.out;
  EXPECT_GE(counts[0] + counts[1] + counts[2] + counts[3], 2 * 9) << r.out;  // 2 requests, 9 steps at least
  // The CPU backend records no graphs: its steps are eager ones.
  const auto& target = j.at("draft_length").at("target_ms_by_rows");
  const auto& eager = j.at("draft_length").at("eager_target_ms_by_rows");
  const auto& draft = j.at("draft_length").at("draft_ms_by_requests_x_k");
  EXPECT_TRUE(target.empty()) << r.out;
  EXPECT_FALSE(eager.empty()) << r.out;
  EXPECT_FALSE(draft.empty()) << r.out;
  EXPECT_EQ(j.at("draft_length").at("eager_penalty_ms").get<double>(), 0.0) << r.out;  // no graph step to be over
  for (const auto& figures : {eager, draft}) {
    for (const auto& [key, ms] : figures.items()) {
      EXPECT_GT(ms.get<double>(), 0.0) << key;
      EXPECT_LT(ms.get<double>(), 1e4) << key;
    }
  }
  for (const auto& [key, ms] : draft.items()) EXPECT_NE(key.find('x'), std::string::npos) << key;
  EXPECT_EQ(j.at("preemptions").get<uint64_t>(), 0u) << r.out;  // two short requests fit its KV
  r = Hsx(bench + spec("fixed"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  j = nlohmann::json::parse(r.out.substr(0, r.out.find('\n')));
  EXPECT_FALSE(j.contains("draft_length")) << r.out;
}

TEST_F(CliTest, DecodeBenchForcesTheAcceptanceRateAndRefusesItElsewhere) {
  const std::string model = " --model " + test::ModelDir("llama");
  const std::string bench = "bench --decode" + model + " --prompt-len 8 --new-tokens 9 --kv-cache-gib 0.05 --batch-sizes 2";
  const std::string spec = " --speculative-config '{\"method\": \"eagle3\", \"model\": \"" +
                            test::DataPath("eagle3/llama_legacy") + "\", \"num_speculative_tokens\": 3}'";
  CommandResult r = Hsx(bench + spec + " --spec-bench-accept-rate 1");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out.substr(0, r.out.find('\n')));
  ASSERT_TRUE(j.contains("mean_acceptance_length")) << r.out;
  EXPECT_EQ(j.at("mean_acceptance_length").get<double>(), 4.0) << r.out;
  EXPECT_EQ(j.at("accepted_tokens").get<int>(), j.at("draft_tokens").get<int>());
  EXPECT_EQ(j.at("forced_accept_rate").get<double>(), 1.0);
  for (const std::string& bad : {bench + " --spec-bench-accept-rate 0.5",
                                 "bench" + model + spec + " --spec-bench-accept-rate 0.5"}) {
    r = Hsx(bad);
    EXPECT_NE(r.exit_code, 0) << bad;
    EXPECT_NE(r.err.find("--spec-bench-accept-rate needs --decode and --speculative-config"), std::string::npos) << r.err;
  }
  r = Hsx(bench + spec + " --spec-bench-accept-rate 1.5");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("--spec-bench-accept-rate"), std::string::npos) << r.err;
  // Probes are the adaptive policy's: the cap without it is refused, not ignored.
  r = Hsx(bench + spec + " --spec-bench-probe-drafts 1");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("--spec-bench-probe-drafts needs --decode and a --speculative-config with"), std::string::npos)
      << r.err;
  const std::string prompts = WriteLines("p.jsonl", {R"({"id": "a", "token_ids": [1, 2, 3]})"});
  r = Hsx("generate" + model + " --input " + prompts + " --max-tokens 2" + spec + " --spec-bench-accept-rate 1");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("--spec-bench-accept-rate"), std::string::npos) << r.err;
  EXPECT_EQ(r.out, "");
}

TEST_F(CliTest, BadLinesFailAloneWithLineNumbers) {
  const std::string prompts = WriteLines(
      "bad.jsonl", {R"({"id": "good", "token_ids": [1, 2, 3, 4]})", R"({bad json)", R"([1, 2])", R"({"token_ids": [1]})",
                    R"({"id": "oov", "token_ids": [1, 512]})", R"({"id": "empty", "token_ids": []})",
                    R"({"id": "neither"})", R"({"id": "types", "token_ids": ["a"]})", R"({"id": "good", "token_ids": [5]})",
                    R"({"id": "../escape", "token_ids": [5]})", R"({"id": "a/b", "token_ids": [5]})",
                    R"({"id": "text", "prompt": "no tokenizer here"})", "", R"({"id": 7, "token_ids": [9, 9]})",
                    R"({"id": "deep", "x": )" + std::string(100000, '[') + std::string(100000, ']') + "}"});
  const std::string out = dir_ + "/out";
  CommandResult r = Hsx("extract --model " + test::ModelDir("qwen3") + " --layers 0,4 --input " + prompts + " --output " + out);
  EXPECT_EQ(r.exit_code, 1);
  for (const char* expected : {"bad.jsonl:2: malformed JSON", "bad.jsonl:3: expected a JSON object",
                               "bad.jsonl:4: missing field 'id'",
                               "bad.jsonl:5: request 'oov': token id 512 at position 1 is outside the vocabulary [0, 512)",
                               "bad.jsonl:6: request 'empty': empty prompt", "bad.jsonl:7: expected field 'token_ids'",
                               "bad.jsonl:8: field 'token_ids' must be a list of integers",
                               "bad.jsonl:9: duplicate id 'good' (first on line 1)", "bad.jsonl:10: request id '../escape'",
                               "bad.jsonl:11: request id 'a/b' contains '/'", "bad.jsonl:12: has 'prompt' text but the model has no tokenizer.json",
                               "bad.jsonl:15: malformed JSON (expected one object per line): JSON nested deeper than 64",
                               "wrote 2 files", "12 failed"}) {
    EXPECT_NE(r.err.find(expected), std::string::npos) << "missing: " << expected << "\nstderr:\n" << r.err;
  }
  // Only the good requests' files and the manifest: no temp or partial files.
  std::set<std::string> names;
  for (const auto& e : fs::directory_iterator(out)) names.insert(e.path().filename().string());
  EXPECT_EQ(names, (std::set<std::string>{"good.safetensors", "7.safetensors", "manifest.jsonl"}));
  EXPECT_FALSE(fs::exists(dir_ + "/escape.safetensors"));
}

TEST_F(CliTest, BadLayersAndOutputFailBeforeAnyWork) {
  const std::string prompts = WriteLines("p.jsonl", {R"({"id": "a", "token_ids": [1, 2]})"});
  const std::string model = " --model " + test::ModelDir("qwen3") + " --input " + prompts;
  struct Case { std::string args, expected; };
  const std::string file_in_the_way = WriteLines("a-file", {"x"});
  for (const Case& c : std::vector<Case>{
           {"--layers 0,5 --output " + dir_ + "/o1", "--layers: layer id 5 is out of range [0, 4] for this 4-layer model"},
           {"--layers 2,2 --output " + dir_ + "/o2", "--layers: layer id 2 is given twice"},
           {"--layers 1,x --output " + dir_ + "/o3", "--layers: 'x' is not an integer"},
           {"--layers -1 --output " + dir_ + "/o4", "out of range"},
           {"--layers 1 --output " + file_in_the_way + "/sub", "cannot create directory"},
           {"--layers 1 --output " + dir_ + "/o5 --dtype int8", "--dtype: 'int8' is not one of"},
       }) {
    CommandResult r = Hsx("extract" + model + " " + c.args);
    EXPECT_EQ(r.exit_code, 1) << c.args;
    EXPECT_NE(r.err.find(c.expected), std::string::npos) << c.args << "\n" << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << "one line: " << r.err;
  }
  EXPECT_FALSE(fs::exists(dir_ + "/o1"));
  CommandResult missing_input = Hsx("extract --model " + test::ModelDir("qwen3") + " --layers 1 --input " + dir_ +
                                    "/nope.jsonl --output " + dir_ + "/o6");
  EXPECT_EQ(missing_input.exit_code, 1);
  EXPECT_NE(missing_input.err.find("nope.jsonl: cannot open input"), std::string::npos) << missing_input.err;
}

TEST_F(CliTest, GenerateMatchesGoldenGreedy) {
  SafetensorsFile golden = test::Golden(test::ModelDir("gemma3") + "/golden.safetensors");
  CommandResult r = Hsx("generate --model " + test::ModelDir("gemma3") + " --input " + GoldenPrompts(golden) +
                        " --max-tokens 8 --ignore-eos");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::stringstream lines(r.out);
  std::string line;
  int seen = 0;
  while (std::getline(lines, line)) {
    const auto j = nlohmann::json::parse(line);
    const std::string id = j["id"].get<std::string>();
    EXPECT_EQ(j["token_ids"].get<std::vector<int32_t>>(), test::AsIds(golden.Get("greedy_" + id.substr(1)).value())) << id;
    ++seen;
  }
  EXPECT_EQ(seen, 3);
}

// --quantization fp8: extract writes states that differ from the f32 run's by FP8's rounding
// (within test_float8's bound), and the flag is refused with --batch-invariant.
TEST_F(CliTest, ExtractWithFp8QuantizationStaysNearTheGoldens) {
  const std::string model = test::ModelDir("qwen3");
  SafetensorsFile golden = test::Golden(model + "/golden.safetensors");
  const std::string prompts = GoldenPrompts(golden);
  CommandResult r = Hsx("extract --model " + model + " --input " + prompts + " --output " + dir_ +
                        "/out --layers 4 --dtype float32 --quantization fp8");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  SafetensorsFile file = test::Golden(dir_ + "/out/p1.safetensors");
  const std::vector<float> mine = test::AsFloats(file.Get("hidden_states").value());  // [T, 1, H]
  const Tensor gold_all = golden.Get("hidden_1").value();                              // [T, N+1, H]
  const int64_t t = gold_all.size(0), layers = gold_all.size(1), h = gold_all.size(2);
  ASSERT_EQ(static_cast<int64_t>(mine.size()), t * h);
  const std::vector<float> all = test::AsFloats(gold_all);
  std::vector<float> gold;
  for (int64_t i = 0; i < t; ++i) gold.insert(gold.end(), all.begin() + (i * layers + 4) * h, all.begin() + (i * layers + 5) * h);
  const double err = test::RelativeMaxError(mine, gold);
  EXPECT_GT(err, 1e-4);  // FP8 changed the computation ...
  EXPECT_LT(err, 0.3);   // ... by its rounding, not more
  r = Hsx("extract --model " + model + " --input " + prompts + " --output " + dir_ + "/out2 --layers 0 " +
          "--quantization fp8 --batch-invariant");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("--quantization fp8 and --batch-invariant"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(dir_ + "/out2/manifest.jsonl"));
}

// --max-tokens near INT32_MAX wrapped prompt + max_tokens past the length check (issue 9.1):
// every line now fails alone, naming max_model_len, and the command exits 1.
TEST_F(CliTest, GenerateRefusesMaxTokensBeyondTheModelLength) {
  SafetensorsFile golden = test::Golden(test::ModelDir("qwen3") + "/golden.safetensors");
  CommandResult r = Hsx("generate --model " + test::ModelDir("qwen3") + " --input " + GoldenPrompts(golden) +
                        " --max-tokens 2147483647 --ignore-eos");
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_EQ(r.out, "");
  EXPECT_NE(r.err.find("2147483647 new tokens exceed max_model_len 4096"), std::string::npos) << r.err;
}

// --speculative-config on generate: an EAGLE-3 draft gives the plain greedy tokens; a bad
// config, a missing draft directory or a draft that does not fit the target fails before
// any work, naming what is wrong, with no output.
TEST_F(CliTest, GenerateSpeculativeConfigWorksOrFailsNamingTheProblem) {
  SafetensorsFile golden = test::Golden(test::ModelDir("llama") + "/golden.safetensors");
  const std::string base = "generate --model " + test::ModelDir("llama") + " --input " + GoldenPrompts(golden) +
                           " --max-tokens 8 --ignore-eos --batch-invariant";
  const CommandResult plain = Hsx(base);
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  const CommandResult drafted = Hsx(base + " --speculative-config '{\"method\": \"eagle3\", \"model\": \"" +
                                    test::DataPath("eagle3/llama_copy") + "\", \"num_speculative_tokens\": 3}'");
  ASSERT_EQ(drafted.exit_code, 0) << drafted.err;
  auto by_id = [](const std::string& out) {
    std::map<std::string, std::vector<int32_t>> tokens;
    std::stringstream lines(out);
    for (std::string line; std::getline(lines, line);) {
      const auto j = nlohmann::json::parse(line);
      tokens[j["id"].get<std::string>()] = j["token_ids"].get<std::vector<int32_t>>();
    }
    return tokens;
  };
  EXPECT_EQ(by_id(drafted.out), by_id(plain.out));
  EXPECT_NE(drafted.err.find("speculative decoding accepted"), std::string::npos) << drafted.err;
  // SGLang's dynamic-tree flags, as --speculative-config fields.
  const CommandResult dynamic = Hsx(base + " --speculative-config '{\"method\": \"eagle3\", \"model\": \"" +
                                    test::DataPath("eagle3/llama_copy") +
                                    "\", \"num_speculative_tokens\": 6, \"speculative_eagle_topk\": 2, "
                                    "\"speculative_num_steps\": 3}'");
  ASSERT_EQ(dynamic.exit_code, 0) << dynamic.err;
  EXPECT_EQ(by_id(dynamic.out), by_id(plain.out));

  const std::vector<std::pair<std::string, std::string>> bad = {
      {"'{\"method\": \"ngram\", \"num_speculative_tokens\": 999}'", "[1, 64]"},
      {"'{\"method\": \"eagle3\", \"model\": \"/nonexistent/draft\"}'", "/nonexistent/draft"},
      // a Gemma 4 assistant for a Llama target
      {"'{\"method\": \"mtp\", \"model\": \"" + test::DataPath("mtp/gemma4_assistant") +
           "\", \"num_speculative_tokens\": 2}'", "Gemma 4"},
      {"'{\"method\": \"extract_hidden_states\", \"draft_model_config\": {\"hf_config\": "
       "{\"eagle_aux_hidden_state_layer_ids\": [1]}}}'", "is for extract and serve"},
      {"'[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]'", "--speculative-config"},
  };
  for (const auto& [config, expected] : bad) {
    const CommandResult r = Hsx(base + " --speculative-config " + config);
    EXPECT_EQ(r.exit_code, 1) << config;
    EXPECT_EQ(r.out, "") << config;
    EXPECT_NE(r.err.find(expected), std::string::npos) << config << ": " << r.err;
  }
}

// --tensor-parallel-size on the cpu (ranks as threads): generate's greedy tokens are the
// goldens', extract's files match them within the fixtures' tolerance, bench --decode
// runs; a size the model cannot split, and drafts under it, fail naming the flag and the
// field, with no output.
TEST_F(CliTest, TensorParallelCommandsMatchGoldensOrFailNamingTheField) {
  SafetensorsFile gemma3 = test::Golden(test::ModelDir("gemma3") + "/golden.safetensors");
  CommandResult r = Hsx("generate --model " + test::ModelDir("gemma3") + " --input " + GoldenPrompts(gemma3) +
                        " --max-tokens 8 --ignore-eos --tensor-parallel-size 2");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::stringstream lines(r.out);
  int seen = 0;
  for (std::string line; std::getline(lines, line); ++seen) {
    const auto j = nlohmann::json::parse(line);
    const std::string id = j["id"].get<std::string>();
    EXPECT_EQ(j["token_ids"].get<std::vector<int32_t>>(), test::AsIds(gemma3.Get("greedy_" + id.substr(1)).value())) << id;
  }
  EXPECT_EQ(seen, 3);

  SafetensorsFile moe = test::Golden(test::ModelDir("qwen3_moe") + "/golden.safetensors");
  const int64_t layers_total = moe.Get("hidden_0")->size(1), h = moe.Get("hidden_0")->size(2);
  r = Hsx("extract --model " + test::ModelDir("qwen3_moe") + " --layers 0," + std::to_string(layers_total - 1) +
          " --input " + GoldenPrompts(moe) + " --output " + dir_ + "/tp --dtype float32 --tensor-parallel-size 4");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (int k = 0; k < 3; ++k) {
    auto file = SafetensorsFile::Open(dir_ + "/tp/p" + std::to_string(k) + ".safetensors");
    ASSERT_TRUE(file.ok()) << file.status().message();
    const std::vector<float> all = test::AsFloats(moe.Get("hidden_" + std::to_string(k)).value());
    std::vector<float> ref;
    for (int64_t i = 0; i < static_cast<int64_t>(all.size()) / (layers_total * h); ++i)
      for (int64_t l : {int64_t{0}, layers_total - 1})
        ref.insert(ref.end(), all.begin() + (i * layers_total + l) * h, all.begin() + (i * layers_total + l + 1) * h);
    EXPECT_LE(test::RelativeMaxError(test::AsFloats(file->Get("hidden_states").value()), ref), 1e-4) << k;
  }

  r = Hsx("bench --decode --model " + test::ModelDir("qwen3") +
          " --prompt-len 8 --new-tokens 3 --kv-cache-gib 0.05 --batch-sizes 2 --tensor-parallel-size 2");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("\"batch\":2"), std::string::npos) << r.out;

  const std::string prompts = GoldenPrompts(gemma3);
  const std::vector<std::pair<std::string, std::string>> bad = {
      {" --tensor-parallel-size 3", "--tensor-parallel-size 3: config.json's num_attention_heads (4)"},
      {" --tensor-parallel-size 8", "--tensor-parallel-size 8: config.json's num_attention_heads (4)"},
      {" --tensor-parallel-size 2 --speculative-config '{\"method\": \"eagle3\", \"model\": \"" +
           test::DataPath("eagle3/llama_copy") + "\", \"num_speculative_tokens\": 3}'",
       "EAGLE-3 drafts do not run with --tensor-parallel-size > 1"},
  };
  for (const auto& [flags, expected] : bad) {
    r = Hsx("generate --model " + test::ModelDir("llama") + " --input " + prompts + " --max-tokens 4" + flags);
    EXPECT_EQ(r.exit_code, 1) << flags;
    EXPECT_EQ(r.out, "") << flags;
    EXPECT_NE(r.err.find(expected), std::string::npos) << flags << ": " << r.err;
  }
}

TEST_F(CliTest, TokenizeMatchesGoldenIdsAndReportsBadLines) {
  std::ifstream in(test::DataPath("tokenizers/bpe_llama3/golden_public.json"));
  const auto golden = nlohmann::json::parse(in);
  std::vector<std::string> lines;
  for (const auto& c : golden["cases"]) lines.push_back(nlohmann::json{{"text", c["text"]}}.dump());
  lines.push_back("{\"txt\": 1}");
  CommandResult r = Hsx("tokenize --tokenizer " + test::DataPath("tokenizers/bpe_llama3/tokenizer.json") + " --input " +
                        WriteLines("texts.jsonl", lines));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("texts.jsonl:" + std::to_string(lines.size()) + ": expected a string field 'text'"), std::string::npos)
      << r.err;
  std::stringstream out(r.out);
  std::string line;
  size_t i = 0;
  while (std::getline(out, line)) {
    ASSERT_LT(i, golden["cases"].size());
    EXPECT_EQ(nlohmann::json::parse(line)["ids"], golden["cases"][i]["ids"]) << golden["cases"][i]["text"];
    ++i;
  }
  EXPECT_EQ(i, golden["cases"].size());
}

TEST_F(CliTest, InspectDescribesLayersAndRejectsUnknownModels) {
  CommandResult r = Hsx("inspect --model " + test::ModelDir("gemma4_kvshare"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("Gemma4ForCausalLM"), std::string::npos);
  EXPECT_NE(r.out.find("7 full     head_dim 32   kv_heads 1   k=v kv-shared-from 5"), std::string::npos) << r.out;
  // Named configs are described without filling their weights (31B would not fit as f32).
  CommandResult gemma = Hsx("inspect --model gemma-4-31b --load-format dummy");
  ASSERT_EQ(gemma.exit_code, 0) << gemma.err;
  EXPECT_NE(gemma.out.find("parameters        30.697B"), std::string::npos) << gemma.out;
  EXPECT_NE(gemma.out.find("  4 sliding  head_dim 256  kv_heads 16"), std::string::npos) << gemma.out;
  EXPECT_NE(gemma.out.find(" 59 full     head_dim 512  kv_heads 4   k=v"), std::string::npos) << gemma.out;
  CommandResult bad = Hsx("inspect --model no-such-model --load-format dummy");
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_NE(bad.err.find("neither a model directory nor a named config"), std::string::npos) << bad.err;
}

TEST_F(CliTest, ServeRejectsAnEmptyConnectionPool) {
  CommandResult r = Hsx("serve " + test::ModelDir("qwen3") + " --http-threads 0");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("--http-threads: Value 0 not in range 1 to 65536"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace hsx
