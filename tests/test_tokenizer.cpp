// The tokenizer against Hugging Face tokenizers' goldens for three tokenizer families, plus
// bad and hostile files, added-token flags, special tokens and long inputs.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "tokenizer/bpe.h"
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

// Writes `contents` to `name` in this process's own temporary directory (Load reads a
// tokenizer_config.json beside a tokenizer.json, so no other file may be there by chance).
std::string WriteTempFile(const std::string& name, const std::string& contents) {
  const std::filesystem::path path = std::filesystem::temp_directory_path() /
                                     ("hsx_test_tokenizer_" + std::to_string(::getpid())) / name;
  std::filesystem::create_directories(path.parent_path());
  std::ofstream(path, std::ios::binary) << contents;
  return path.string();
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

// Pieces of 100k characters (a run of spaces, one long word, digits) encode and decode back.
TEST_P(GoldenTokenizerTest, LongPiecesRoundTrip) {
  Tokenizer tokenizer = LoadOrDie(TokenizerDir(GetParam()) + "/tokenizer.json");
  std::string word;
  for (int i = 0; i < 10'000; ++i) word += "thelongest";
  std::string digits;
  for (int i = 0; i < 10'000; ++i) digits += "0123456789";
  for (const std::string& text : {std::string(100'000, ' '), word, digits,
                                  std::string(50'000, '\n') + std::string(50'000, ' ') + "x"}) {
    std::vector<int32_t> ids = EncodeOrDie(tokenizer, text);
    Result<std::string> decoded = tokenizer.Decode(ids);
    ASSERT_TRUE(decoded.ok()) << decoded.status().message();
    EXPECT_EQ(*decoded, text);
  }
}

// BPE's work on a piece of n symbols is O(n) candidate merges (each a heap operation, so
// O(n log n) time): counted, not timed, so the check holds on any machine. A rescan of all
// pairs after every merge would examine O(n^2).
TEST_P(GoldenTokenizerTest, BpeMergeWorkIsLinearInThePieceLength) {
  json config = ReadJson(TokenizerDir(GetParam()) + "/tokenizer.json");
  if (config["model"]["merges"].empty()) GTEST_SKIP() << "this fixture has no merges";
  Result<BpeModel> model = BpeModel::FromJson(config["model"], "model");
  ASSERT_TRUE(model.ok()) << model.status().message();
  // Symbols as the model sees them: byte-level spaces are "Ġ", SentencePiece's are "▁".
  const std::string space = model->TokenToId("Ġ") ? "Ġ" : "▁";
  std::string word, digits, spaces;
  for (int i = 0; i < 5'000; ++i) word += "thelongest";
  for (int i = 0; i < 5'000; ++i) digits += "0123456789";
  for (int i = 0; i < 50'000; ++i) spaces += space;
  size_t merged = 0;
  for (const std::string& piece : {word, digits, spaces}) {
    std::vector<int32_t> ids;
    size_t steps = 0;
    model->Encode(piece, &ids, &steps);
    const size_t symbols = 50'000;
    // n - 1 initial pairs, and at most two new pairs per merge, of which there are < n.
    EXPECT_LE(steps, 3 * symbols) << "piece starting " << piece.substr(0, 20);
    merged += symbols - ids.size();
  }
  EXPECT_GT(merged, 25'000u);  // the pieces exercise merging
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
  // A directory or a device (which would be read forever) is refused as well.
  for (const std::string path : {"/nonexistent/tokenizer.json", "/dev/zero", "/tmp"}) {
    Result<Tokenizer> tokenizer = Tokenizer::Load(path);
    ASSERT_FALSE(tokenizer.ok());
    EXPECT_TRUE(tokenizer.status().message().starts_with(path + ": "))
        << tokenizer.status().message();
  }
}

TEST(TokenizerTest, MalformedJsonIsAnError) {
  std::string path = WriteTempFile("malformed.json", "{\"model\": {\"type\": \"BPE\",");
  Result<Tokenizer> tokenizer = Tokenizer::Load(path);
  ASSERT_FALSE(tokenizer.ok());
  EXPECT_NE(tokenizer.status().message().find(path + ": invalid JSON"), std::string::npos)
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


// Files built to hurt: each must give an error naming the file and the field, without
// aborting, allocating gigabytes or overflowing the stack.
TEST(TokenizerTest, HostileFilesAreErrorsNamingTheFileAndField) {
  const std::string qwen = TokenizerDir("bpe_qwen2") + "/tokenizer.json";
  std::ifstream in(qwen);
  const std::string original((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto with_vocab_id = [&](const std::string& id) {
    std::string text = original;
    const std::string entry = "\"Ġw\": 320";
    size_t at = text.find(entry);
    EXPECT_NE(at, std::string::npos);
    return text.replace(at, entry.size(), "\"Ġw\": " + id);
  };
  struct Case {
    std::string name;
    std::string contents;
    std::string expected;  // in the message, after the file's path
  };
  const std::vector<Case> cases = {
      {"huge_number.json", with_vocab_id("1e999"), "invalid JSON"},
      {"id_2_31.json", with_vocab_id("2147483646"), "model.vocab: the id of 'Ġw' must be"},
      {"id_1e8.json", with_vocab_id("100000000"), "model.vocab: the id of 'Ġw' must be"},
      {"negative_id.json", with_vocab_id("-1"), "model.vocab: the id of 'Ġw' must be"},
      {"float_id.json", with_vocab_id("3.5"), "model.vocab: the id of 'Ġw' must be"},
      {"deep.json",
       "{\"normalizer\": " + std::string(1'000'000, '[') + std::string(1'000'000, ']') + "}",
       "nested deeper than"},
      {"not_object.json", "[1, 2]", "expected a JSON object"},
      {"empty.json", "", "invalid JSON"},
      {"model_missing.json", "{}", "model: missing"},
      {"vocab_not_object.json", R"({"model": {"type": "BPE", "vocab": [], "merges": []}})",
       "model.vocab: expected an object"},
      {"added_not_array.json",
       R"({"model": {"type": "BPE", "vocab": {}, "merges": []}, "added_tokens": 5})",
       "added_tokens: expected an array"},
      {"added_bad_flag.json",
       R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []},
           "added_tokens": [{"content": "x", "lstrip": "yes"}]})",
       "added_tokens[0].lstrip: expected true or false"},
      {"post_id_out_of_range.json",
       R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []},
           "post_processor": {"type": "TemplateProcessing",
             "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
             "special_tokens": {"<s>": {"id": "<s>", "ids": [2147483647], "tokens": ["<s>"]}}}})",
       "post_processor.special_tokens.<s>.ids: id 2147483647 is outside the vocabulary of 1 ids"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string path = WriteTempFile(c.name, c.contents);
    Result<Tokenizer> tokenizer = Tokenizer::Load(path);
    ASSERT_FALSE(tokenizer.ok());
    EXPECT_TRUE(tokenizer.status().message().starts_with(path + ": "))
        << tokenizer.status().message();
    EXPECT_NE(tokenizer.status().message().find(c.expected), std::string::npos)
        << tokenizer.status().message();
  }
}

// A component hsx does not implement is refused by name, never approximated.
TEST(TokenizerTest, UnsupportedComponentsAreRefusedByName) {
  const json base = ReadJson(TokenizerDir("bpe_qwen2") + "/tokenizer.json");
  const std::vector<std::pair<std::string, json>> cases = {
      {"normalizer", {{"type", "Precompiled"}, {"precompiled_charsmap", "AAAA"}}},
      {"normalizer", {{"type", "BertNormalizer"}}},
      {"pre_tokenizer", {{"type", "UnicodeScripts"}}},
      {"decoder", {{"type", "WordPiece"}, {"prefix", "##"}}},
      {"post_processor", {{"type", "SomethingNew"}}},
  };
  for (const auto& [stage, component] : cases) {
    json config = base;
    config[stage] = component;
    const std::string type = component["type"].get<std::string>();
    Result<Tokenizer> tokenizer = Tokenizer::Load(WriteTempFile(type + ".json", config.dump()));
    ASSERT_FALSE(tokenizer.ok()) << type;
    EXPECT_NE(tokenizer.status().message().find(stage + ".type '" + type + "' is not supported"),
              std::string::npos)
        << tokenizer.status().message();
  }
}

// Text prompts get the post-processor's special tokens by default, as in HF and vLLM
// (Llama 3's "<|begin_of_text|> $A", Gemma's "<bos> $A"); add_special_tokens=false leaves them
// out. Expected ids from HF tokenizers 0.23.
TEST(TokenizerTest, TemplateProcessingAddsSpecialTokensByDefault) {
  json config = ReadJson(TokenizerDir("bpe_llama3") + "/tokenizer.json");
  config["post_processor"] = {
      {"type", "Sequence"},
      {"processors",
       {{{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", false},
         {"use_regex", true}},
        {{"type", "TemplateProcessing"},
         {"single",
          {{{"SpecialToken", {{"id", "<|im_start|>"}, {"type_id", 0}}}},
           {{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
           {{"SpecialToken", {{"id", "<|im_end|>"}, {"type_id", 0}}}}}},
         {"pair", json::array()},
         {"special_tokens",
          {{"<|im_start|>", {{"id", "<|im_start|>"}, {"ids", {1}}, {"tokens", {"<|im_start|>"}}}},
           {"<|im_end|>", {{"id", "<|im_end|>"}, {"ids", {2}}, {"tokens", {"<|im_end|>"}}}}}}}}}};
  Tokenizer tokenizer = LoadOrDie(WriteTempFile("template.json", config.dump()));
  const std::vector<int32_t> plain = tokenizer.Encode("Hello world", false).value();
  ASSERT_FALSE(plain.empty());
  std::vector<int32_t> wrapped = {1};
  wrapped.insert(wrapped.end(), plain.begin(), plain.end());
  wrapped.push_back(2);
  EXPECT_EQ(tokenizer.Encode("Hello world", true).value(), wrapped);
  EXPECT_EQ(tokenizer.Encode("Hello world").value(), wrapped);
  EXPECT_EQ(tokenizer.Encode("Hello world", false).value(), plain);
  EXPECT_EQ(tokenizer.Encode("", true).value(), (std::vector<int32_t>{1, 2}));

  config["post_processor"] = {{"type", "RobertaProcessing"},
                              {"cls", {"<|im_start|>", 1}},
                              {"sep", {"<|endoftext|>", 0}},
                              {"trim_offsets", true},
                              {"add_prefix_space", false}};
  Tokenizer roberta = LoadOrDie(WriteTempFile("roberta.json", config.dump()));
  wrapped.back() = 0;
  EXPECT_EQ(roberta.Encode("Hello world").value(), wrapped);
}

// transformers 5 drops tokenizer_config.json's add_bos_token when a tokenizer.json is there
// (checked with 5.24 for TokenizersBackend, GemmaTokenizer and LlamaTokenizer), so a
// tokenizer_config.json beside the file must change nothing.
TEST(TokenizerTest, TokenizerConfigBesideTheFileChangesNothing) {
  const std::string path =
      WriteTempFile("with_config/tokenizer.json",
                    ReadJson(TokenizerDir("spm_bpe") + "/tokenizer.json").dump());
  WriteTempFile("with_config/tokenizer_config.json",
                json{{"add_bos_token", true}, {"bos_token", "<bos>"}}.dump());
  Tokenizer plain = LoadOrDie(TokenizerDir("spm_bpe") + "/tokenizer.json");
  Tokenizer with_config = LoadOrDie(path);
  EXPECT_EQ(EncodeOrDie(with_config, "Hello world"), EncodeOrDie(plain, "Hello world"));
}

// The pre-tokenizers and normalizers real files use, on a text where each matters; expected
// pieces are HF tokenizers 0.23's (the corpus test in tests/python compares thousands more).
TEST(TokenizerTest, DigitsPreTokenizerSplitsNumbersAsHuggingFace) {
  json config = ReadJson(TokenizerDir("bpe_qwen2") + "/tokenizer.json");
  config["pre_tokenizer"] = {{"type", "Sequence"},
                             {"pretokenizers",
                              {{{"type", "Digits"}, {"individual_digits", true}},
                               {{"type", "ByteLevel"}, {"add_prefix_space", false},
                                {"use_regex", true}}}}};
  Tokenizer tokenizer = LoadOrDie(WriteTempFile("digits.json", config.dump()));
  std::vector<std::string> tokens;
  for (int32_t id : EncodeOrDie(tokenizer, "a 123")) tokens.push_back(tokenizer.IdToToken(id));
  EXPECT_EQ(tokens, (std::vector<std::string>{"a", "Ġ", "1", "2", "3"}));
}

// Patterns are Oniguruma's, as HF compiles them: its \s is Unicode White_Space, without the
// U+180E that PCRE2 10.42's \s takes. Escapes whose meaning differs are refused.
TEST(TokenizerTest, RegexClassesAreOnigurumas) {
  json config = ReadJson(TokenizerDir("bpe_qwen2") + "/tokenizer.json");
  const json byte_level = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}};
  config["pre_tokenizer"] = byte_level;
  Tokenizer whole = LoadOrDie(WriteTempFile("whole.json", config.dump()));
  auto split_on = [&](const std::string& name, const std::string& regex) {
    config["pre_tokenizer"] = {
        {"type", "Sequence"},
        {"pretokenizers",
         {{{"type", "Split"}, {"pattern", {{"Regex", regex}}}, {"behavior", "Removed"},
           {"invert", false}},
          byte_level}}};
    return Tokenizer::Load(WriteTempFile(name, config.dump()));
  };
  Result<Tokenizer> split = split_on("split_space.json", R"(\s+)");
  ASSERT_TRUE(split.ok()) << split.status().message();
  const std::string mongolian_separator = "a\xE1\xA0\x8E" "b", em_space = "a\xE2\x80\x83" "b";
  EXPECT_EQ(EncodeOrDie(*split, mongolian_separator), EncodeOrDie(whole, mongolian_separator));
  std::vector<int32_t> a_then_b = EncodeOrDie(whole, "a");
  a_then_b.push_back(EncodeOrDie(whole, "b").at(0));
  EXPECT_EQ(EncodeOrDie(*split, em_space), a_then_b);

  for (const char* refused : {R"([^\S])", R"(\bword)", R"(\h+)"}) {
    Result<Tokenizer> tokenizer = split_on("refused.json", refused);
    ASSERT_FALSE(tokenizer.ok()) << refused;
    EXPECT_NE(tokenizer.status().message().find("not supported"), std::string::npos)
        << tokenizer.status().message();
  }
}

}  // namespace
}  // namespace hsx
