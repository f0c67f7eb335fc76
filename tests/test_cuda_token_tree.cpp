// Token-tree drafts on CUDA (skipped without a GPU): an EAGLE-3 engine drafting trees small
// enough for the split-KV verification kernel (8 rows a sequence at most, the kernel plain
// decode runs on) emits the plain greedy decode of the same backend on every EAGLE-3
// fixture, static trees and EAGLE-2's dynamic ones; larger trees and HSX_VERIFY_ATTENTION=0 put the rows on the mma.sync kernels,
// whose arithmetic differs from the split-KV kernel's enough to flip a near-tied argmax of
// these small random models: chains there differ from plain decode as well (measured on
// the H200, the control test below), so those runs are reported, not held to equality.
// KVCache::MoveSlots moves a path's KV on the device with every source read before a
// destination is written.
// The mask itself is held to the CPU reference in the op table (tests/test_backend_ops.cpp,
// cases named *tree*).
#ifdef HSX_HAS_CUDA
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "engine/engine.h"
#include "engine/token_tree.h"
#include "model/eagle3_draft.h"
#include "model/kv_cache.h"
#include "model/model.h"
#include "engine_runs.h"
#include "test_util.h"

namespace hsx {
namespace {

std::unique_ptr<CudaBackend> Gpu() {
  auto b = CudaBackend::Create(0);
  return b.ok() ? std::move(b).value() : nullptr;
}

using test::Generation;

// The golden file's three prompts, batched.
Generation Generate(Model& model, const SafetensorsFile& golden, const EngineConfig& config, int max_new_tokens) {
  return test::Generate(model, test::GoldenPrompts(golden), config, max_new_tokens);
}

// 7 nodes (8 rows a sequence, the split-KV verification kernel's) and 4.
const std::vector<std::string> kSmallTrees = {"[(0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0)]",
                                              "[(0,), (1,), (1, 0), (1, 0, 0)]"};
// 15 nodes: the mma.sync kernels.
const std::vector<std::string> kLargeTrees = {
    "[(0,), (1,), (2,), (3,), (0, 0), (0, 1), (1, 0), (1, 1), (2, 0), (0, 0, 0), (0, 0, 1), (0, 1, 0), (1, 0, 0),"
    " (0, 0, 0, 0), (0, 0, 0, 0, 0)]"};

// A tree config for a draft: its label and its drafting.
using TreeConfig = std::pair<std::string, std::function<EngineConfig::Eagle3Drafting(Eagle3Draft*)>>;

std::vector<TreeConfig> StaticTrees(const std::vector<std::string>& texts) {
  std::vector<TreeConfig> configs;
  for (const std::string& text : texts) {
    configs.emplace_back(text, [text](Eagle3Draft* draft) {
      auto tree = TokenTree::Parse(text, "tree");
      EXPECT_TRUE(tree.ok());
      return EngineConfig::Eagle3Drafting{draft, tree->size(), *tree};
    });
  }
  return configs;
}

// exact: the output must equal plain decode (else it is reported).
void ExpectTreesGivePlainDecode(const std::string& what, const std::vector<TreeConfig>& trees, bool exact) {
  auto gpu = Gpu();
  if (!gpu) GTEST_SKIP() << "no CUDA device";
  for (const std::string variant : {"llama_legacy", "qwen3_default", "llama_copy"}) {
    const std::string target = test::Eagle3Target(variant);
    auto model = Model::Load(test::ModelDir(target), *gpu);
    ASSERT_TRUE(model.ok()) << model.status().message();
    auto draft = Eagle3Draft::Load(test::DataPath("eagle3/" + variant), **model, *gpu);
    ASSERT_TRUE(draft.ok()) << draft.status().message();
    SafetensorsFile golden = test::Golden(test::ModelDir(target) + "/golden.safetensors");
    EngineConfig plain;
    plain.scheduler.max_num_batched_tokens = 64;
    const Generation reference = Generate(**model, golden, plain, 24);
    for (const auto& [label, drafting] : trees) {
      EngineConfig speculative = plain;
      speculative.eagle3 = drafting(draft->get());
      const Generation run = Generate(**model, golden, speculative, 24);
      if (exact) {
        EXPECT_EQ(run.tokens, reference.tokens) << what << " " << variant << " " << label;
      }
      EXPECT_GT(run.stats.num_draft_tokens, 0u);
      if (variant == "llama_copy") {
        EXPECT_GT(run.stats.num_accepted_tokens, 0u) << variant << " " << label;
      }
      std::printf("[cuda tree] %s %-13s %d nodes %s: %s plain decode; accepted %lu of %lu drafts, %lu steps (plain %lu)\n",
                  what.c_str(), variant.c_str(), speculative.eagle3.num_speculative_tokens, label.c_str(),
                  run.tokens == reference.tokens ? "equals" : "differs from",
                  static_cast<unsigned long>(run.stats.num_accepted_tokens),
                  static_cast<unsigned long>(run.stats.num_draft_tokens), static_cast<unsigned long>(run.stats.steps),
                  static_cast<unsigned long>(reference.stats.steps));
    }
  }
}

TEST(CudaTokenTree, TreeDraftsLeaveGreedyOutputUnchanged) {
  ExpectTreesGivePlainDecode("default", StaticTrees(kSmallTrees), true);
}

// EAGLE-2's dynamic trees (their rounds on graphs: the device chooses each depth's rows), at
// most 7 nodes: the split-KV verification kernel's rows, as plain decode's.
TEST(CudaTokenTree, DynamicTreesLeaveGreedyOutputUnchanged) {
  std::vector<TreeConfig> configs;
  for (const auto& [topk, depth, nodes] : std::vector<std::array<int, 3>>{{2, 3, 6}, {3, 2, 7}, {1, 4, 4}, {4, 4, 7}}) {
    configs.emplace_back("dynamic top " + std::to_string(topk) + " depth " + std::to_string(depth),
                         [=](Eagle3Draft* draft) {
                           return EngineConfig::Eagle3Drafting{draft, nodes, std::nullopt, DynamicTreeConfig{topk, depth}};
                         });
  }
  ExpectTreesGivePlainDecode("default", configs, true);
}

// Tree rows on the mma.sync kernels: larger trees, and any tree with HSX_VERIFY_ATTENTION=0
// (reported against plain decode: the header says why).
TEST(CudaTokenTree, TreeDraftsOnTheMmaKernelsRun) {
  ExpectTreesGivePlainDecode("default", StaticTrees(kLargeTrees), false);
  setenv("HSX_VERIFY_ATTENTION", "0", 1);
  std::vector<std::string> all = kSmallTrees;
  all.insert(all.end(), kLargeTrees.begin(), kLargeTrees.end());
  ExpectTreesGivePlainDecode("HSX_VERIFY_ATTENTION=0", StaticTrees(all), false);
  unsetenv("HSX_VERIFY_ATTENTION");
}

// The control for the test above: chain drafts whose verification rows take the same
// kernels (16 rows a sequence, or any count with HSX_VERIFY_ATTENTION=0: the mma.sync
// kernels; plain decode runs the split-KV kernel), so a difference from plain decode that
// chains show as well comes from the kernels' arithmetic, not from the tree mask.
TEST(CudaTokenTree, ChainDraftsOnTheSameKernelsAgainstPlainDecode) {
  for (const bool verify_kernel : {true, false}) {
    if (!verify_kernel) setenv("HSX_VERIFY_ATTENTION", "0", 1);
    auto gpu = Gpu();
    if (!gpu) GTEST_SKIP() << "no CUDA device";
    for (const std::string variant : {"llama_legacy", "qwen3_default"}) {
      const std::string target = test::Eagle3Target(variant);
      auto model = Model::Load(test::ModelDir(target), *gpu);
      ASSERT_TRUE(model.ok());
      auto draft = Eagle3Draft::Load(test::DataPath("eagle3/" + variant), **model, *gpu);
      ASSERT_TRUE(draft.ok());
      SafetensorsFile golden = test::Golden(test::ModelDir(target) + "/golden.safetensors");
      EngineConfig plain;
      plain.scheduler.max_num_batched_tokens = 64;
      const Generation reference = Generate(**model, golden, plain, 24);
      for (int k : {3, 15}) {
        EngineConfig chain = plain;
        chain.eagle3 = {draft->get(), k};
        const Generation run = Generate(**model, golden, chain, 24);
        std::printf("[cuda chain] verify kernel %d %-13s K=%d: %s plain decode\n", verify_kernel, variant.c_str(), k,
                    run.tokens == reference.tokens ? "equals" : "DIFFERS FROM");
      }
    }
    unsetenv("HSX_VERIFY_ATTENTION");
  }
}

// Accept's compaction on the device: slots 6 -> 5, 8 -> 6 (6 is read before it is
// written), 9 -> 7; the rest untouched.
TEST(CudaTokenTree, MoveSlotsCompactsThePathOnTheDevice) {
  auto gpu = Gpu();
  if (!gpu) GTEST_SKIP() << "no CUDA device";
  auto model = Model::Load(test::ModelDir("llama"), *gpu);
  ASSERT_TRUE(model.ok()) << model.status().message();
  KVCache cache((*model)->config(), *gpu, 4, 4);
  std::vector<Tensor*> tensors;
  for (int l = 0; l < (*model)->config().num_layers; ++l) tensors.insert(tensors.end(), {&cache.k(l), &cache.v(l)});
  std::vector<std::vector<uint16_t>> before;
  for (size_t i = 0; i < tensors.size(); ++i) {
    Tensor host = Tensor::Host(tensors[i]->dtype(), tensors[i]->shape());
    ASSERT_EQ(DTypeSize(host.dtype()), 2u);
    auto* bits = static_cast<uint16_t*>(host.raw());
    for (int64_t e = 0; e < host.numel(); ++e) bits[e] = static_cast<uint16_t>((i * 7919 + e * 31) & 0x3fff);
    before.emplace_back(bits, bits + host.numel());
    gpu->UploadTo(host, *tensors[i]);
  }
  cache.MoveSlots(*gpu, {6, 8, 9}, {5, 6, 7});
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor after = gpu->Download(*tensors[i]);
    const auto* bits = static_cast<const uint16_t*>(after.raw());
    const int64_t w = after.numel() / after.size(0);
    std::vector<uint16_t> want = before[i];
    std::copy_n(before[i].begin() + 6 * w, w, want.begin() + 5 * w);
    std::copy_n(before[i].begin() + 8 * w, w, want.begin() + 6 * w);
    std::copy_n(before[i].begin() + 9 * w, w, want.begin() + 7 * w);
    EXPECT_TRUE(std::equal(want.begin(), want.end(), bits)) << "tensor " << i;
  }
}

}  // namespace
}  // namespace hsx
#endif  // HSX_HAS_CUDA
