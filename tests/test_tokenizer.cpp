// The tokenizer against Hugging Face tokenizers' goldens for three tokenizer families, plus
// bad inputs, added-token flags and long inputs.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "tokenizer/tokenizer.h"

namespace hsx {
namespace {

using nlohmann::json;

std::string TokenizerDir(const std::string& name) {
  return std::string(HSX_TEST_DATA) + "/tokenizers/" + name;
}

json ReadJson(const std::string& path) {
  std::ifstream file(path);
  return json::parse(file);
}

// Writes `contents` to a fresh file in the test's temporary directory and returns its path.
std::string WriteTempFile(const std::string& name, const std::string& contents) {
  std::string path = (std::filesystem::temp_directory_path() /
                      ("hsx_test_tokenizer_" + std::to_string(::getpid()) + "_" + name))
                         .string();
  std::ofstream(path, std::ios::binary) << contents;
  return path;
}

Tokenizer LoadOrDie(const std::string& path) {
  Result<Tokenizer> tokenizer = Tokenizer::Load(path);
  EXPECT_TRUE(tokenizer.ok()) << tokenizer.status().message();
  return std::move(tokenizer).value();
}

std::vector<int32_t> EncodeOrDie(const Tokenizer& tokenizer, std::string_view text) {
  Result<std::vector<int32_t>> ids = tokenizer.Encode(text);
  EXPECT_TRUE(ids.ok()) << ids.status().message();
  return ids.ok() ? std::move(ids).value() : std::vector<int32_t>();
}

class GoldenTokenizerTest : public ::testing::TestWithParam<std::string> {};

TEST_P(GoldenTokenizerTest, EncodeAndDecodeMatchHuggingFace) {
  Tokenizer tokenizer = LoadOrDie(TokenizerDir(GetParam()) + "/tokenizer.json");
  json golden = ReadJson(TokenizerDir(GetParam()) + "/golden_public.json");
  ASSERT_FALSE(golden["cases"].empty());
  for (const json& c : golden["cases"]) {
    const auto text = c["text"].get<std::string>();
    SCOPED_TRACE("text: " + text);
    std::vector<int32_t> ids = EncodeOrDie(tokenizer, text);
    EXPECT_EQ(ids, c["ids"].get<std::vector<int32_t>>());
    std::vector<std::string> tokens;
    for (int32_t id : ids) tokens.push_back(tokenizer.IdToToken(id));
    EXPECT_EQ(tokens, c["tokens"].get<std::vector<std::string>>());
    Result<std::string> decoded = tokenizer.Decode(c["ids"].get<std::vector<int32_t>>());
    ASSERT_TRUE(decoded.ok()) << decoded.status().message();
    EXPECT_EQ(*decoded, c["decoded"].get<std::string>());
  }
}

// Added tokens split the text, so a long text joined from golden texts with <|endoftext|>
// must encode to the pieces' encodings joined with its id, and decode back to itself.
TEST_P(GoldenTokenizerTest, LongTextEqualsItsPiecesAndRoundTrips) {
  Tokenizer tokenizer = LoadOrDie(TokenizerDir(GetParam()) + "/tokenizer.json");
  json golden = ReadJson(TokenizerDir(GetParam()) + "/golden_public.json");
  const std::string separator = "<|endoftext|>";
  const std::optional<int32_t> separator_id = tokenizer.TokenToId(separator);
  ASSERT_TRUE(separator_id.has_value());

  std::string text;
  std::vector<int32_t> expected;
  while (text.size() < 200'000) {
    for (const json& c : golden["cases"]) {
      const std::vector<int32_t> ids = c["ids"].get<std::vector<int32_t>>();
      text += c["text"].get<std::string>() + separator;
      expected.insert(expected.end(), ids.begin(), ids.end());
      expected.push_back(*separator_id);
    }
  }
  EXPECT_EQ(EncodeOrDie(tokenizer, text), expected);
  Result<std::string> decoded = tokenizer.Decode(expected);
  ASSERT_TRUE(decoded.ok()) << decoded.status().message();
  EXPECT_EQ(*decoded, text);
}

// Pieces of 100k characters (a run of spaces, one long word, digits) must not take quadratic
// time in BPE's merging or in the pre-tokenizer's regex.
TEST_P(GoldenTokenizerTest, LongPiecesEncodeQuicklyAndRoundTrip) {
  Tokenizer tokenizer = LoadOrDie(TokenizerDir(GetParam()) + "/tokenizer.json");
  std::string word;
  for (int i = 0; i < 10'000; ++i) word += "thelongest";
  std::string digits;
  for (int i = 0; i < 10'000; ++i) digits += "0123456789";
  for (const std::string& text : {std::string(100'000, ' '), word, digits,
                                  std::string(50'000, '\n') + std::string(50'000, ' ') + "x"}) {
    auto start = std::chrono::steady_clock::now();
    std::vector<int32_t> ids = EncodeOrDie(tokenizer, text);
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(2));
    Result<std::string> decoded = tokenizer.Decode(ids);
    ASSERT_TRUE(decoded.ok()) << decoded.status().message();
    EXPECT_EQ(*decoded, text);
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, GoldenTokenizerTest,
                         ::testing::Values("bpe_qwen2", "bpe_llama3", "spm_bpe"));

TEST(TokenizerTest, VocabularyLookups) {
  Tokenizer tokenizer = LoadOrDie(TokenizerDir("bpe_qwen2") + "/tokenizer.json");
  EXPECT_EQ(tokenizer.vocab_size(), 3000);
  EXPECT_EQ(tokenizer.TokenToId("<|im_start|>"), 1);
  EXPECT_EQ(tokenizer.TokenToId("Ġworld"), std::nullopt);
  EXPECT_EQ(tokenizer.TokenToId("Ġw"), 320);
  EXPECT_EQ(tokenizer.IdToToken(320), "Ġw");
  EXPECT_EQ(tokenizer.IdToToken(2), "<|im_end|>");
  EXPECT_EQ(tokenizer.IdToToken(-1), "");
  EXPECT_EQ(tokenizer.IdToToken(3000), "");
}

// Byte-fallback: characters outside the vocabulary become <0xNN> tokens, and a byte run that
// is not valid UTF-8 decodes to one U+FFFD per byte, as HF's ByteFallback decoder does.
TEST(TokenizerTest, ByteFallbackEncodesAndDecodesUnknownCharacters) {
  Tokenizer tokenizer = LoadOrDie(TokenizerDir("spm_bpe") + "/tokenizer.json");
  const std::string text = "a\xF0\x90\x8D\x88z";  // U+10348, not in the vocabulary
  std::vector<int32_t> ids = EncodeOrDie(tokenizer, text);
  ASSERT_EQ(ids.size(), 6u);
  EXPECT_EQ(tokenizer.IdToToken(ids[1]), "<0xF0>");
  EXPECT_EQ(tokenizer.IdToToken(ids[4]), "<0x88>");
  EXPECT_EQ(tokenizer.Decode(ids).value(), text);
  EXPECT_EQ(tokenizer.Decode({ids[1], ids[2]}).value(), "\xEF\xBF\xBD\xEF\xBF\xBD");
}

// Byte-level tokens holding part of a character decode to U+FFFD, as HF's from_utf8_lossy does.
TEST(TokenizerTest, ByteLevelDecodesCutCharactersToReplacementCharacters) {
  Tokenizer tokenizer = LoadOrDie(TokenizerDir("bpe_qwen2") + "/tokenizer.json");
  const std::optional<int32_t> c3 = tokenizer.TokenToId("Ã"), a9 = tokenizer.TokenToId("©");
  ASSERT_TRUE(c3 && a9);
  EXPECT_EQ(tokenizer.Decode({*c3, *a9}).value(), "é");
  EXPECT_EQ(tokenizer.Decode({*c3}).value(), "\xEF\xBF\xBD");
  EXPECT_EQ(tokenizer.Decode({*a9, *c3, 42}).value(), "\xEF\xBF\xBD\xEF\xBF\xBDH");
}

// lstrip/rstrip/single_word of added tokens; expected ids come from HF tokenizers 0.23.
TEST(TokenizerTest, AddedTokenFlagsFollowHuggingFace) {
  json config = ReadJson(TokenizerDir("bpe_qwen2") + "/tokenizer.json");
  auto add = [&](int id, const char* content, bool lstrip, bool rstrip, bool single_word) {
    config["added_tokens"].push_back({{"id", id},
                                      {"content", content},
                                      {"single_word", single_word},
                                      {"lstrip", lstrip},
                                      {"rstrip", rstrip},
                                      {"normalized", false},
                                      {"special", true}});
  };
  add(3000, "<mask>", true, true, false);
  add(3001, "cat", false, false, true);
  Tokenizer tokenizer = LoadOrDie(WriteTempFile("flags.json", config.dump()));
  EXPECT_EQ(tokenizer.vocab_size(), 3002);
  EXPECT_EQ(EncodeOrDie(tokenizer, "a  <mask>  b"), (std::vector<int32_t>{67, 3000, 68}));
  EXPECT_EQ(EncodeOrDie(tokenizer, "cat concat cat_ cat!"),
            (std::vector<int32_t>{3001, 435, 69, 272, 288, 272, 65, 223, 3001, 3}));
}

TEST(TokenizerTest, MissingFileIsAnErrorNamingIt) {
  Result<Tokenizer> tokenizer = Tokenizer::Load("/nonexistent/tokenizer.json");
  ASSERT_FALSE(tokenizer.ok());
  EXPECT_NE(tokenizer.status().message().find("/nonexistent/tokenizer.json"), std::string::npos)
      << tokenizer.status().message();
}

TEST(TokenizerTest, MalformedJsonIsAnError) {
  std::string path = WriteTempFile("malformed.json", "{\"model\": {\"type\": \"BPE\",");
  Result<Tokenizer> tokenizer = Tokenizer::Load(path);
  ASSERT_FALSE(tokenizer.ok());
  EXPECT_NE(tokenizer.status().message().find(path + ": not valid JSON"), std::string::npos)
      << tokenizer.status().message();
}

TEST(TokenizerTest, UnsupportedModelTypeIsAnErrorNamingTheField) {
  std::string path =
      WriteTempFile("wordpiece.json",
                    R"({"model": {"type": "WordPiece", "vocab": {"a": 0}}, "added_tokens": []})");
  Result<Tokenizer> tokenizer = Tokenizer::Load(path);
  ASSERT_FALSE(tokenizer.ok());
  EXPECT_EQ(tokenizer.status().message(),
            path + ": model.type 'WordPiece' is not supported; expected BPE");
}

TEST(TokenizerTest, BadFieldsAreErrorsNamingTheField) {
  json config = ReadJson(TokenizerDir("bpe_qwen2") + "/tokenizer.json");
  config["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(unclosed";
  Result<Tokenizer> bad_regex = Tokenizer::Load(WriteTempFile("bad_regex.json", config.dump()));
  ASSERT_FALSE(bad_regex.ok());
  EXPECT_NE(bad_regex.status().message().find(
                "pre_tokenizer.pretokenizers[0].pattern.Regex: invalid regex"),
            std::string::npos)
      << bad_regex.status().message();

  config = ReadJson(TokenizerDir("bpe_qwen2") + "/tokenizer.json");
  config["model"]["merges"][5] = {"Ġ", "no-such-token"};
  Result<Tokenizer> bad_merge = Tokenizer::Load(WriteTempFile("bad_merge.json", config.dump()));
  ASSERT_FALSE(bad_merge.ok());
  EXPECT_NE(bad_merge.status().message().find(
                "model.merges[5]: 'no-such-token' is not in the vocabulary"),
            std::string::npos)
      << bad_merge.status().message();
}

TEST(TokenizerTest, DecodingAnIdOutOfRangeIsAnErrorNamingItAndTheVocabSize) {
  Tokenizer tokenizer = LoadOrDie(TokenizerDir("bpe_llama3") + "/tokenizer.json");
  for (int32_t id : {3000, -1}) {
    Result<std::string> text = tokenizer.Decode({42, id});
    ASSERT_FALSE(text.ok());
    EXPECT_NE(text.status().message().find("token id " + std::to_string(id)), std::string::npos);
    EXPECT_NE(text.status().message().find("3000"), std::string::npos) << text.status().message();
  }
}

TEST(TokenizerTest, InvalidUtf8IsAnError) {
  Tokenizer tokenizer = LoadOrDie(TokenizerDir("bpe_qwen2") + "/tokenizer.json");
  for (std::string_view text : {"abc\xFF", "caf\xC3", "\xED\xA0\x80", "\xC0\xAF", "ok\x80"}) {
    Result<std::vector<int32_t>> ids = tokenizer.Encode(text);
    EXPECT_FALSE(ids.ok()) << "accepted: " << text;
    if (!ids.ok()) {
      EXPECT_NE(ids.status().message().find("not valid UTF-8"), std::string::npos);
    }
  }
}

}  // namespace
}  // namespace hsx
