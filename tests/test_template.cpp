// The Jinja subset (src/template): expected texts below were rendered by jinja2 3.1.6 under
// transformers' settings (trim_blocks, lstrip_blocks); tests/python/test_chat_template.py compares
// real templates with transformers itself. Here: whitespace control, number and repr printing,
// errors with line numbers, every resource bound, and a fuzz run that must never crash.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <unistd.h>

#include "template/chat_template.h"
#include "template/template.h"

namespace hsx::tmpl {
namespace {

Value Messages() {
  return Value(ValueList{Value(ValueDict{{"role", Value("user")}, {"content", Value(" hi ")}}),
                         Value(ValueDict{{"role", Value("assistant")}, {"content", Value("yo")}})});
}

Result<std::string> Render(const std::string& source, const RenderLimits& limits = {}) {
  auto t = Template::Parse(source);
  if (!t.ok()) return t.status();
  return t->Render({{"messages", Messages()}}, limits);
}

std::string RenderOk(const std::string& source) {
  auto r = Render(source);
  EXPECT_TRUE(r.ok()) << source << ": " << r.status().message();
  return r.ok() ? *r : "<error>";
}

std::string RenderError(const std::string& source, const RenderLimits& limits = {}) {
  auto r = Render(source, limits);
  EXPECT_FALSE(r.ok()) << source << " rendered " << (r.ok() ? *r : "");
  return r.ok() ? "" : r.status().message();
}

TEST(Template, WhitespaceControlAsHuggingFaceSetsIt) {
  EXPECT_EQ(RenderOk("  {% if true %}\n  a\n  {% endif %}\n b"), "  a\n b");
  EXPECT_EQ(RenderOk("x {%- if true -%} \n y \n {%- endif %}"), "xy");
  EXPECT_EQ(RenderOk("{{ 1 }}\n{# c #}\n{{ 2 }}\n"), "1\n2");
  EXPECT_EQ(RenderOk("a\r\nb\rc\n\n"), "a\nb\nc\n");
  EXPECT_EQ(RenderOk("{%+ if true %}k{% endif +%}\nn"), "k\nn");
}

TEST(Template, LoopsFiltersAndPrinting) {
  EXPECT_EQ(RenderOk("{% for m in messages %}{{ m.role }}:{{ m.content | trim }}{% if not loop.last %}|{% endif %}{% endfor %}"),
            "user:hi|assistant:yo");
  EXPECT_EQ(RenderOk("{{ 0.1 + 0.2 }} {{ 1e16 }} {{ 1e-5 }} {{ 100.0 }} {{ -0.0 }} {{ 2.5e-300 * 1e-10 }} {{ 7 // -2 }} "
                     "{{ 7.5 // 2 }} {{ -7.5 % 2 }}"),
            "0.30000000000000004 1e+16 1e-05 100.0 -0.0 2.5e-310 -4 3.0 0.5");
  EXPECT_EQ(RenderOk("{{ {'a': [1, {'b': none}], 'c': 'x\"y\\'z'} }}|{{ {'a': [1, {'b': none}]} | tojson(indent=2) }}"),
            "{'a': [1, {'b': None}], 'c': 'x\"y\\'z'}|{\n  \"a\": [\n    1,\n    {\n      \"b\": null\n    }\n  ]\n}");
  EXPECT_EQ(RenderOk("{{ messages[::-1] | map(attribute='role') | join(',') }}"), "assistant,user");
  EXPECT_EQ(RenderOk("{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}{% endfor %}{{ ns.n }}"), "2");
}

TEST(Template, ErrorsNameTheLine) {
  EXPECT_EQ(RenderError("a\nb\n{{ raise_exception('roles must alternate') }}"), "line 3: roles must alternate");
  EXPECT_EQ(RenderError("\n{% for x in y %}\n{{ x }\n"), "line 3: tag opened here is never closed ('}}')");
  EXPECT_NE(RenderError("{% if x %}\n\nno end").find("template ended inside a block"), std::string::npos);
  EXPECT_NE(RenderError("\n\n{{ nope.attr }}").find("line 3: 'nope' is undefined"), std::string::npos);
  EXPECT_NE(RenderError("{{ messages[0].content + 1 }}").find("unsupported operand type(s) for +: 'str' and 'int'"),
            std::string::npos);
  EXPECT_NE(RenderError("{% frobnicate %}").find("unknown or unexpected tag 'frobnicate'"), std::string::npos);
  EXPECT_NE(RenderError("{{ 'a' | nosuchfilter }}").find("no filter named 'nosuchfilter'"), std::string::npos);
  EXPECT_NE(RenderError("{{ 99999999999999999999 }}").find("out of range"), std::string::npos);
  EXPECT_NE(RenderError("{{ 9223372036854775807 + 1 }}").find("overflow"), std::string::npos);
  EXPECT_NE(RenderError("{{ -9223372036854775807 - 2 }}").find("overflow"), std::string::npos);
  EXPECT_NE(RenderError("{{ 3 ** 40 }}").find("overflow"), std::string::npos);
  EXPECT_NE(RenderError("{{ (-9223372036854775807 - 1) | abs }}").find("overflow"), std::string::npos);
  EXPECT_EQ(RenderOk("{{ (-1) ** 3 }} {{ 2 ** 62 }} {{ 0 ** 0 }} {{ (-1) ** 1000000000000 }} {{ 7 ** 0 }}"),
            "-1 4611686018427387904 1 1 1");
  EXPECT_NE(RenderError("{{ 1 // 0 }}").find("by zero"), std::string::npos);
  EXPECT_NE(RenderError("{{ 'a'[::0] }}").find("zero"), std::string::npos);
  EXPECT_NE(RenderError(std::string("\xff")).find("UTF-8"), std::string::npos);
}

TEST(Template, EveryResourceIsBounded) {
  RenderLimits small;
  small.max_output_bytes = 1000;
  small.max_loop_iterations = 500;
  small.max_work = 100000;
  EXPECT_NE(RenderError("{% for i in range(100) %}{{ 'x' * 20 }}{% endfor %}", small).find("output exceeds 1000"), std::string::npos);
  EXPECT_NE(RenderError("{{ 'x' * 100000000000 }}").find("larger than"), std::string::npos);
  EXPECT_NE(RenderError("{{ range(1000000000) | length }}").find("larger than"), std::string::npos);
  EXPECT_NE(RenderError("{% for i in range(100) %}{% for j in range(100) %}{% endfor %}{% endfor %}", small).find("loop iterations"),
            std::string::npos);
  EXPECT_NE(RenderError("{% set ns = namespace(s='ab') %}{% for i in range(60) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}").find("larger than"),
            std::string::npos);
  EXPECT_NE(RenderError("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}").find("macro calls nest deeper"), std::string::npos);
  EXPECT_NE(RenderError("{% set ns = namespace(x=[]) %}{% for i in range(1000) %}{% set ns.x = [ns.x] %}{% endfor %}")
                .find("nests deeper"),
            std::string::npos);
  // Deep syntax fails while parsing, before any recursion could exhaust the stack.
  EXPECT_NE(RenderError("{{ " + std::string(100000, '(') + " }}").find("nests deeper"), std::string::npos);
  EXPECT_NE(RenderError("{{ " + std::string(100000, '[') + " }}").find("nests deeper"), std::string::npos);
  EXPECT_NE(RenderError("{{ -" + std::string(100000, '-') + "1 }}").find("nests deeper"), std::string::npos);
  std::string chain = "{{ 1";
  for (int i = 0; i < 100000; ++i) chain += " + 1";
  EXPECT_NE(RenderError(chain + " }}").find("nests deeper"), std::string::npos);
  std::string blocks;
  for (int i = 0; i < 5000; ++i) blocks += "{% if true %}";
  EXPECT_NE(RenderError(blocks).find("nests deeper"), std::string::npos);
}

// Random token soup and mutations of a real template: every render ends with text or an
// error, never a crash, a hang or unbounded memory (ASan/UBSan builds check the rest).
TEST(Template, FuzzNeverCrashes) {
  const std::vector<std::string> pieces = {
      "{{", "}}", "{%", "%}", "{#", "#}", "-", "+", " ", "\n", "if", "elif", "else", "endif", "for", "in", "endfor",
      "set", "endset", "macro", "endmacro", "namespace(", "ns.x", "=", "(", ")", "[", "]", "{", "}", ",", ":", ".", "|",
      "trim", "tojson", "join", "length", "is", "not", "defined", "and", "or", "~", "*", "/", "//", "%", "**", "'s'",
      "\"t\"", "1", "0", "-1", "1.5", "messages", "m", "loop", "index", "range(", "raise_exception(", "x", "y", "none",
      "break", "continue", "::-1", "strip(", "split(", "items()", "'\\u00e9'", "'\\x'", "selectattr(", "'role'", "é"};
  const std::string real =
      "{%- for message in messages %}{%- if loop.first and message['role'] != 'system' %}{{ '<|s|>' }}{% endif %}"
      "{{ '<|' + message['role'] + '|>\\n' + message['content'] | trim + '<|e|>' }}{% endfor %}"
      "{%- if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}";
  std::mt19937 rng(1234);
  RenderLimits limits;
  limits.max_output_bytes = 1 << 16;
  limits.max_work = 1 << 20;
  int rendered = 0;
  for (int i = 0; i < 4000; ++i) {
    std::string source;
    if (i % 2 == 0) {
      const int n = 1 + static_cast<int>(rng() % 40);
      for (int k = 0; k < n; ++k) source += pieces[rng() % pieces.size()];
    } else {
      source = real;
      const int edits = 1 + static_cast<int>(rng() % 4);
      for (int k = 0; k < edits; ++k) {
        const size_t at = rng() % (source.size() + 1);
        if (rng() % 2 == 0 && at < source.size()) source.erase(at, 1 + rng() % 5);
        else source.insert(at, pieces[rng() % pieces.size()]);
      }
    }
    auto t = Template::Parse(source);
    if (!t.ok()) continue;
    auto r = t->Render({{"messages", Messages()}, {"add_generation_prompt", Value(true)}}, limits);
    rendered += r.ok();
  }
  EXPECT_GT(rendered, 100);  // the fuzz reaches the renderer, not only the parser
}

TEST(ChatTemplate, ChecksMessagesNamingTheField) {
  auto chat = ChatTemplate::Create("{% for m in messages %}{{ m.content }}{% endfor %}", {});
  ASSERT_TRUE(chat.ok());
  auto render = [&](const char* json) { return chat->Render(nlohmann::ordered_json::parse(json), {}); };
  EXPECT_EQ(*render(R"([{"role": "user", "content": "a"}, {"role": "assistant", "content": null}])"), "aNone");
  EXPECT_EQ(render("{}").status().message(), "messages: expected an array of messages, got object");
  EXPECT_EQ(render("[]").status().message(), "messages: expected at least one message");
  EXPECT_EQ(render(R"([{"content": "a"}])").status().message(), "messages[0].role: missing");
  EXPECT_EQ(render(R"([{"role": "user"}, {"role": ["x"]}])").status().message(), "messages[1].role: expected a string, got array");
  EXPECT_EQ(render(R"([{"role": "user", "content": 3}])").status().message(),
            "messages[0].content: expected a string, null or an array of text parts, got number");
  EXPECT_EQ(render(R"([{"role": "user", "content": [{"type": "image_url"}]}])").status().message(),
            "messages[0].content[0].type: only \"text\" parts are supported, got \"image_url\"");
}

// Where a model directory's template comes from, as transformers 5 resolves it.
TEST(ChatTemplate, FindsTheTemplateAsTransformersDoes) {
  const std::string dir = (std::filesystem::temp_directory_path() / ("hsx-chat-" + std::to_string(getpid()))).string();
  std::filesystem::create_directories(dir);
  auto write = [&](const std::string& name, const std::string& text) { std::ofstream(dir + "/" + name) << text; };
  EXPECT_FALSE(FindChatTemplate(dir)->has_value());  // none: a clear "no template" later
  write("tokenizer_config.json", R"({"chat_template": "from config", "bos_token": {"content": "<s>"}})");
  EXPECT_EQ(**FindChatTemplate(dir), "from config");
  write("tokenizer_config.json", R"({"chat_template": [{"name": "tool_use", "template": "t"}, {"name": "default", "template": "d"}]})");
  EXPECT_EQ(**FindChatTemplate(dir), "d");
  write("tokenizer_config.json", R"({"chat_template": [{"name": "tool_use", "template": "t"}]})");
  EXPECT_NE(FindChatTemplate(dir).status().message().find("without a \"default\""), std::string::npos);
  write("tokenizer_config.json", R"({"chat_template": 7})");
  EXPECT_NE(FindChatTemplate(dir).status().message().find("expected a string or a list"), std::string::npos);
  write("chat_template.jinja", "from jinja");  // the standalone file wins, as in transformers 5
  EXPECT_EQ(**FindChatTemplate(dir), "from jinja");
  write("chat_template.jinja", "{{ bos_token }}{% for m in messages %}{{ m.content }}{% endfor %}");
  write("tokenizer_config.json", R"({"bos_token": {"content": "<s>"}, "eos_token": "</s>", "pad_token": null})");
  auto chat = ChatTemplate::Load(dir);
  ASSERT_TRUE(chat.ok() && chat->has_value()) << chat.status().message();
  EXPECT_EQ(*(*chat)->Render(nlohmann::ordered_json::parse(R"([{"role": "user", "content": "x"}])"), {}), "<s>x");
  write("chat_template.jinja", "{% if %}");
  EXPECT_NE(ChatTemplate::Load(dir).status().message().find("chat template: line 1"), std::string::npos);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace hsx::tmpl
