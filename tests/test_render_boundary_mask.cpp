// The render-boundary loss mask on templates that are not prefix-stable: one that strips
// earlier assistant turns once later turns follow (as Qwen3's strips reasoning) leaves those
// turns as context and still supervises the last; one whose history renders differently with
// a generation prompt has no boundary, and the error names the turn.
#include <gtest/gtest.h>

#include "template/render_boundary_mask.h"
#include "test_util.h"

namespace hsx {
namespace {

nlohmann::ordered_json Conversation() {
  return nlohmann::ordered_json::parse(R"([
    {"role": "user", "content": "one"}, {"role": "assistant", "content": "two"},
    {"role": "user", "content": "three"}, {"role": "assistant", "content": "four"}])");
}

std::vector<int32_t> Ids(const Tokenizer& t, const std::string& text) { return *t.Encode(text, false); }

// The text of the tokens the mask supervises.
std::string Supervised(const Tokenizer& t, const std::vector<int32_t>& ids, const std::vector<uint8_t>& mask) {
  std::vector<int32_t> supervised;
  for (size_t i = 0; i < ids.size(); ++i)
    if (mask[i]) supervised.push_back(ids[i]);
  return *t.Decode(supervised);
}

TEST(RenderBoundaryMaskTest, PrefixStableTemplateSupervisesEveryAssistantTurn) {
  auto tokenizer = Tokenizer::Load(test::DataPath("tokenizers/bpe_qwen2/tokenizer.json"));
  ASSERT_TRUE(tokenizer.ok());
  auto chat = ChatTemplate::Create(
      "{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}{% if add_generation_prompt %}[assistant]{% endif %}", {});
  ASSERT_TRUE(chat.ok());
  const auto full = Ids(*tokenizer, "[user]one[assistant]two[user]three[assistant]four");
  auto mask = RenderBoundaryLossMask(*chat, *tokenizer, Conversation(), {}, full);
  ASSERT_TRUE(mask.ok()) << mask.status().message();
  EXPECT_EQ(Supervised(*tokenizer, full, *mask), "twofour");
}

TEST(RenderBoundaryMaskTest, AHistoryRewritingTemplateLeavesEarlierTurnsAsContext) {
  auto tokenizer = Tokenizer::Load(test::DataPath("tokenizers/bpe_qwen2/tokenizer.json"));
  ASSERT_TRUE(tokenizer.ok());
  // Assistant turns before the last are shortened to "..." (history rewritten).
  auto chat = ChatTemplate::Create(
      "{% for m in messages %}[{{ m.role }}]{% if m.role == 'assistant' and not loop.last %}...{% else %}"
      "{{ m.content }}{% endif %}{% endfor %}{% if add_generation_prompt %}[assistant]{% endif %}", {});
  ASSERT_TRUE(chat.ok());
  const auto full = Ids(*tokenizer, "[user]one[assistant]...[user]three[assistant]four");
  auto mask = RenderBoundaryLossMask(*chat, *tokenizer, Conversation(), {}, full);
  ASSERT_TRUE(mask.ok()) << mask.status().message();
  EXPECT_EQ(Supervised(*tokenizer, full, *mask), "four");
}

TEST(RenderBoundaryMaskTest, HistoryThatRendersDifferentlyWithAGenerationPromptHasNoBoundary) {
  auto tokenizer = Tokenizer::Load(test::DataPath("tokenizers/bpe_qwen2/tokenizer.json"));
  ASSERT_TRUE(tokenizer.ok());
  // With a generation prompt the user turns are upper-cased: the renders differ inside the history.
  auto chat = ChatTemplate::Create(
      "{% for m in messages %}[{{ m.role }}]{% if add_generation_prompt %}{{ m.content | upper }}{% else %}"
      "{{ m.content }}{% endif %}{% endfor %}{% if add_generation_prompt %}[assistant]{% endif %}", {});
  ASSERT_TRUE(chat.ok());
  const auto full = Ids(*tokenizer, "[user]one[assistant]two[user]three[assistant]four");
  auto mask = RenderBoundaryLossMask(*chat, *tokenizer, Conversation(), {}, full);
  ASSERT_FALSE(mask.ok());
  EXPECT_NE(mask.status().message().find("messages[1]"), std::string::npos) << mask.status().message();
}

}  // namespace
}  // namespace hsx
