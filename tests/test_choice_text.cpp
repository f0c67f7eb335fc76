// A choice's tokens handed over by the engine thread and decoded on the server's: the stop
// string's token is found once, and a finished sequence that ran past it (or ended at it
// by max_tokens) is cut back to it: tokens, logprobs, rows, and counted as stopped.
#include <gtest/gtest.h>

#include "server/choice_text.h"
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

// A finished sequence of `prompt` and `generated`, with logprobs and, as with
// include_output_tokens, one row per token but the last, each row holding its position.
std::unique_ptr<Sequence> Finished(const std::vector<int32_t>& prompt, const std::vector<int32_t>& generated,
                                   bool stopped) {
  Request r{"r", prompt, static_cast<int>(generated.size())};
  r.include_output_tokens = true;
  auto seq = std::make_unique<Sequence>(std::move(r));
  for (size_t i = 0; i < generated.size(); ++i) {
    seq->Append(generated[i]);
    seq->logprobs.push_back({-static_cast<float>(i), {}});
  }
  if (stopped) seq->Stop();
  seq->hidden_states = Tensor::Host(DType::kF32, {seq->num_capture_rows(), 1, 1});
  for (int64_t p = 0; p < seq->num_capture_rows(); ++p) seq->hidden_states.data<float>()[p] = static_cast<float>(p);
  return seq;
}

class ChoiceTextTest : public ::testing::Test {
 protected:
  const Tokenizer tok = LoadQwen2();
  const std::vector<int32_t> prompt = Encode(tok, "Count:");
  const std::vector<int32_t> ids = Encode(tok, " one two three four five six");
  // The stop string "ee fo" is complete once the first n tokens are out.
  const int n = [&] {
    for (size_t k = 1; k <= ids.size(); ++k) {
      auto text = tok.Decode(std::vector<int32_t>(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(k)));
      if (text.ok() && text->find("ee fo") != std::string::npos) return static_cast<int>(k);
    }
    return 0;
  }();
  const size_t total = ids.size();
  std::shared_ptr<ChoiceText> Make(std::vector<std::string> stop) {
    return std::make_shared<ChoiceText>(std::make_shared<ChoiceText::Signal>(), &tok, prompt,
                                        CompletionText::Options{std::move(stop), false, 0, {}});
  }
};

TEST_F(ChoiceTextTest, DecodeFindsTheTokenThatCompletesAStopStringOnce) {
  ASSERT_GT(n, 1);
  ASSERT_LT(static_cast<size_t>(n), total);  // tokens follow it
  auto choice = Make({"ee fo"});
  for (int i = 0; i < n - 1; ++i) choice->Push(ids[i]);
  EXPECT_EQ(choice->Decode(), std::nullopt);
  EXPECT_EQ(choice->kept(), static_cast<size_t>(n - 1));
  for (size_t i = n - 1; i < total; ++i) choice->Push(ids[i]);  // the engine ran on
  EXPECT_TRUE(choice->undecoded());
  EXPECT_EQ(choice->Decode(), std::optional<int>(n));
  EXPECT_EQ(choice->Decode(), std::nullopt);  // asked once
  EXPECT_FALSE(choice->undecoded());
  EXPECT_EQ(choice->kept(), static_cast<size_t>(n));
  EXPECT_EQ(choice->tokens().size(), total);
  EXPECT_EQ(choice->text().text(), " one two thr");
}

TEST_F(ChoiceTextTest, SettleCutsASequenceThatRanPastItsStop) {
  auto choice = Make({"ee fo"});
  for (int32_t id : ids) choice->Push(id);
  ASSERT_EQ(choice->Decode(), std::optional<int>(n));
  auto seq = Finished(prompt, ids, /*stopped=*/false);  // ended by max_tokens, past it
  choice->Settle(*seq);
  EXPECT_EQ(seq->generated(), std::vector<int32_t>(ids.begin(), ids.begin() + n));
  EXPECT_TRUE(seq->stopped());
  ASSERT_EQ(seq->logprobs.size(), static_cast<size_t>(n));
  EXPECT_EQ(seq->logprobs[n - 1].logprob, -static_cast<float>(n - 1));
  const int64_t rows = static_cast<int64_t>(prompt.size()) + n - 1;  // the n-th token never ran
  ASSERT_EQ(seq->hidden_states.size(0), rows);
  for (int64_t p = 0; p < rows; ++p) EXPECT_EQ(seq->hidden_states.data<float>()[p], static_cast<float>(p));
}

// A sequence that ended before the handler decoded anything: Settle decodes its tokens.
TEST_F(ChoiceTextTest, SettleDecodesWhatNobodyDecodedYet) {
  auto choice = Make({"ee fo"});
  auto seq = Finished(prompt, ids, /*stopped=*/false);
  choice->Settle(*seq);
  EXPECT_EQ(seq->num_generated(), n);
  EXPECT_TRUE(seq->stopped());
  choice->text().Finish();
  EXPECT_EQ(choice->text().text(), " one two thr");
}

// Ended by max_tokens at the very token that completed the stop string: not cut, but
// stopped (finish_reason "stop", as when the engine itself stopped there).
TEST_F(ChoiceTextTest, SettleMarksAStopAtTheLastTokenAsStopped) {
  auto choice = Make({"ee fo"});
  auto seq = Finished(prompt, std::vector<int32_t>(ids.begin(), ids.begin() + n), /*stopped=*/false);
  const int64_t rows = seq->hidden_states.size(0);
  choice->Settle(*seq);
  EXPECT_EQ(seq->num_generated(), n);
  EXPECT_TRUE(seq->stopped());
  EXPECT_EQ(seq->hidden_states.size(0), rows);
}

TEST_F(ChoiceTextTest, SettleLeavesSequencesWithoutAStopAlone) {
  auto choice = Make({"never"});
  auto seq = Finished(prompt, ids, /*stopped=*/false);
  choice->Settle(*seq);
  EXPECT_EQ(seq->generated(), ids);
  EXPECT_FALSE(seq->stopped());
  EXPECT_EQ(seq->logprobs.size(), ids.size());
  // A failed sequence is never cut (it has no file and no answer).
  auto failed = Finished(prompt, ids, /*stopped=*/false);
  failed->error = Error("boom");
  Make({"ee fo"})->Settle(*failed);
  EXPECT_EQ(failed->generated(), ids);
}

// The writer's form: a shared sequence stays as it is (the answer has its own copy); a cut
// one comes back as a cut copy, the same decision as the handler's.
TEST_F(ChoiceTextTest, SettledCopiesOnlyWhatItCuts) {
  auto choice = Make({"ee fo"});
  std::shared_ptr<const Sequence> whole = Finished(prompt, ids, /*stopped=*/false);
  std::shared_ptr<const Sequence> cut = choice->Settled(whole);
  ASSERT_NE(cut, whole);
  EXPECT_EQ(whole->num_generated(), static_cast<int>(total));
  EXPECT_EQ(cut->num_generated(), n);
  EXPECT_EQ(cut->hidden_states.size(0), static_cast<int64_t>(prompt.size()) + n - 1);
  auto plain = Make({"never"});
  EXPECT_EQ(plain->Settled(whole), whole);
}

}  // namespace
}  // namespace hsx
