// A completion's text built token by token: the same text as decoding all tokens at once,
// stop strings cut it (also across tokens and inside min_tokens as vLLM counts), and
// ready() never shows what a stop string will cut or half a character.
#include <gtest/gtest.h>

#include "server/completion_text.h"
#include "test_util.h"

namespace hsx {
namespace {

Tokenizer LoadQwen2() {
  auto t = Tokenizer::Load(test::DataPath("tokenizers/bpe_qwen2/tokenizer.json"));
  EXPECT_TRUE(t.ok()) << t.status().message();
  return std::move(t).value();
}

std::vector<int32_t> Encode(const Tokenizer& t, const std::string& text) {
  auto ids = t.Encode(text);
  EXPECT_TRUE(ids.ok()) << ids.status().message();
  return std::move(ids).value();
}

TEST(CompletionTextTest, IncrementalTextEqualsDecodingEverything) {
  const Tokenizer tok = LoadQwen2();
  const std::string expected = " The café — naïve 日本語 text, with  spaces\n and 🙂 emoji.";
  const std::vector<int32_t> prompt = Encode(tok, "Say:");
  CompletionText text(&tok, prompt, {});
  for (int32_t id : Encode(tok, expected)) {
    EXPECT_FALSE(text.Add(id));
    // What is ready is always whole characters of the final text.
    EXPECT_EQ(text.text().substr(0, text.ready()), expected.substr(0, text.ready()));
  }
  text.Finish();
  EXPECT_EQ(text.text(), expected);
  EXPECT_EQ(text.ready(), expected.size());
}

TEST(CompletionTextTest, StopStringEndsTheTextAndIsHeldBackUntilDecided) {
  const Tokenizer tok = LoadQwen2();
  const std::vector<int32_t> ids = Encode(tok, " one two three four");
  CompletionText text(&tok, {}, {{"three"}, false, 0, {}});
  bool stopped = false;
  size_t i = 0;
  for (; i < ids.size() && !stopped; ++i) {
    stopped = text.Add(ids[i]);
    // Never ready: any prefix of a stop string at the end.
    EXPECT_EQ(text.text().substr(0, text.ready()).find("thr"), std::string::npos);
  }
  EXPECT_TRUE(stopped);
  EXPECT_LT(i, ids.size());  // the engine is told to stop at the token that completed it
  EXPECT_EQ(text.text(), " one two ");
  EXPECT_EQ(text.ready(), text.text().size());

  CompletionText kept(&tok, {}, {{"two"}, true, 0, {}});
  for (int32_t id : ids)
    if (kept.Add(id)) break;
  EXPECT_EQ(kept.text(), " one two");  // include_stop_str_in_output
}

TEST(CompletionTextTest, MinTokensAndStopTokensFollowVllm) {
  const Tokenizer tok = LoadQwen2();
  const std::vector<int32_t> ids = Encode(tok, " one two one two");
  ASSERT_EQ(ids.size(), 4u);
  // " one" lies within min_tokens = 1: only the second " one" stops the text.
  CompletionText text(&tok, {}, {{" one"}, false, 1, {}});
  bool stopped = false;
  for (int32_t id : ids) stopped = stopped || text.Add(id);
  EXPECT_TRUE(stopped);
  EXPECT_EQ(text.text(), " one two");
  // A stop token ends the sequence without adding its text.
  const int32_t eos = *tok.TokenToId("<|endoftext|>");
  CompletionText with_eos(&tok, {}, {{}, false, 0, {eos}});
  with_eos.Add(ids[0]);
  with_eos.Add(eos);
  with_eos.Finish();
  EXPECT_EQ(with_eos.text(), " one");
}

TEST(CompletionTextTest, NoTokenizerMeansNoText) {
  CompletionText text(nullptr, {1, 2}, {});
  EXPECT_FALSE(text.Add(5));
  text.Finish();
  EXPECT_EQ(text.text(), "");
}

}  // namespace
}  // namespace hsx
