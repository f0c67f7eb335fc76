// A bounded, deterministic fuzz run of the tokenizer (CI runs it under ASan+UBSan): mutated
// tokenizer.json files must load or fail with an error naming the file, and random byte
// strings (invalid UTF-8 included) must encode or fail cleanly, with every id in range.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "tokenizer/tokenizer.h"

namespace hsx {
namespace {

using nlohmann::json;

std::string FixturePath(const std::string& name) {
  return std::string(HSX_TEST_DATA) + "/tokenizers/" + name + "/tokenizer.json";
}

std::string ReadText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

class TokenizerFuzzTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("hsx_tokenizer_fuzz_" + std::to_string(::getpid()) + "_" + GetParam());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // Loads `contents` as a tokenizer.json; a failure must name the file.
  void ExpectLoadsOrNamesTheFile(const std::string& contents, const std::string& what) {
    const std::string path = (dir_ / "tokenizer.json").string();
    std::ofstream(path, std::ios::binary | std::ios::trunc) << contents;
    Result<Tokenizer> tokenizer = Tokenizer::Load(path);
    if (!tokenizer.ok()) {
      EXPECT_TRUE(tokenizer.status().message().starts_with(path + ": "))
          << what << ": " << tokenizer.status().message();
      return;
    }
    // What loads must also encode without crashing.
    Result<std::vector<int32_t>> ids = tokenizer->Encode("Hello world 123 字 <|im_start|>");
    if (ids.ok()) {
      for (int32_t id : *ids) EXPECT_LT(id, tokenizer->vocab_size()) << what;
    }
  }

  std::filesystem::path dir_;
};

// Values that break parsers: huge and non-integral numbers, wrong types, deep nesting.
json HostileValue(std::mt19937& rng) {
  switch (rng() % 12) {
    case 0: return nullptr;
    case 1: return -1;
    case 2: return 2147483646;
    case 3: return 100000000;
    case 4: return 1e308;
    case 5: return "x";
    case 6: return json::array();
    case 7: return json::object();
    case 8: return true;
    case 9: return json::parse(std::string(40, '[') + std::string(40, ']'));
    case 10: return std::string(1, static_cast<char>(rng() % 128));
    default: return -9223372036854775807LL;
  }
}

// Replaces one randomly chosen value (at any depth, bounded walk) by a hostile one.
void MutateOneValue(json* root, std::mt19937& rng) {
  json* node = root;
  for (int depth = 0; depth < 8; ++depth) {
    if (!(node->is_object() || node->is_array()) || node->empty() || rng() % 4 == 0) break;
    auto it = node->begin();
    std::advance(it, rng() % std::min<size_t>(node->size(), 64));
    node = &*it;
  }
  *node = HostileValue(rng);
}

TEST_P(TokenizerFuzzTest, MutatedFilesLoadOrFailNamingTheFile) {
  const std::string original = ReadText(FixturePath(GetParam()));
  const json parsed = json::parse(original);
  std::mt19937 rng(20260);
  for (int i = 0; i < 30; ++i) {
    json mutated = parsed;
    for (int k = 0; k <= static_cast<int>(rng() % 3); ++k) MutateOneValue(&mutated, rng);
    ExpectLoadsOrNamesTheFile(mutated.dump(), "structural mutation " + std::to_string(i));
  }
  // The text itself: flipped bytes, cut short, spliced, numbers made enormous.
  for (int i = 0; i < 30; ++i) {
    std::string text = original;
    switch (i % 4) {
      case 0:
        for (int k = 0; k < 8; ++k) text[rng() % text.size()] = static_cast<char>(rng());
        break;
      case 1: text.resize(rng() % text.size()); break;
      case 2: text.insert(rng() % text.size(), original.substr(rng() % original.size(), 200)); break;
      default: {
        size_t digit = text.find_first_of("0123456789", rng() % text.size());
        if (digit != std::string::npos) text.insert(digit, "99999999999999999999");
      }
    }
    ExpectLoadsOrNamesTheFile(text, "byte mutation " + std::to_string(i));
  }
}

TEST_P(TokenizerFuzzTest, RandomBytesEncodeOrFailCleanly) {
  Result<Tokenizer> tokenizer = Tokenizer::Load(FixturePath(GetParam()));
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status().message();
  // Pieces that matter to tokenizers: multibyte characters, spaces, digits, added tokens.
  const std::vector<std::string> pieces = {
      "a", " ", "  ", "\n", "\r\n", "\t", "7", "123", "é", "字", "한", "ก", "\xD8\xB9",
      "\xE0\xA4\x85", "\xF0\x9F\x91\x8D", "\xF0\x9F\x8F\xBD", "\xE2\x80\x8D", "\xCC\x81",
      "\xC2\xA0", "\xE3\x80\x80", "<|im_start|>", "<|endoftext|>", "<bos>", "<|im_", "'s",
      "\x00", "\x1B", "\xFF", "\xC3", "\xED\xA0\x80", "\xF4\x90\x80\x80", "\x80"};
  std::mt19937 rng(7);
  int valid = 0;
  for (int i = 0; i < 1500; ++i) {
    std::string text;
    const int parts = static_cast<int>(rng() % 24);
    for (int k = 0; k < parts; ++k) {
      if (rng() % 5 == 0) {
        text += static_cast<char>(rng());  // any byte at all
      } else {
        text += pieces[rng() % pieces.size()];
      }
    }
    Result<std::vector<int32_t>> ids = tokenizer->Encode(text, rng() % 2 == 0);
    if (!ids.ok()) {
      EXPECT_NE(ids.status().message().find("not valid UTF-8"), std::string::npos)
          << ids.status().message();
      continue;
    }
    ++valid;
    for (int32_t id : *ids) ASSERT_TRUE(id >= 0 && id < tokenizer->vocab_size());
    Result<std::string> decoded = tokenizer->Decode(*ids);
    ASSERT_TRUE(decoded.ok()) << decoded.status().message();
  }
  EXPECT_GT(valid, 100);  // the corpus exercises encoding, not only the UTF-8 check
  // Random ids decode to valid UTF-8 (cut characters become U+FFFD).
  for (int i = 0; i < 500; ++i) {
    std::vector<int32_t> ids;
    for (int k = 0; k < static_cast<int>(rng() % 10); ++k)
      ids.push_back(static_cast<int32_t>(rng() % tokenizer->vocab_size()));
    Result<std::string> decoded = tokenizer->Decode(ids);
    ASSERT_TRUE(decoded.ok()) << decoded.status().message();
    Result<std::vector<int32_t>> again = tokenizer->Encode(*decoded, false);
    EXPECT_TRUE(again.ok()) << again.status().message();
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, TokenizerFuzzTest,
                         ::testing::Values("bpe_qwen2", "bpe_llama3", "spm_bpe"));

}  // namespace
}  // namespace hsx
