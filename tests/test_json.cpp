#include <gtest/gtest.h>

#include <string>

#include "util/json.h"

namespace hsx {
namespace {

TEST(ParseJson, ParsesValidDocuments) {
  auto j = ParseJson(R"({"a": [1, {"b": "x[{\"]"}], "c": 1e3})", "doc");
  ASSERT_TRUE(j.ok()) << j.status().message();
  EXPECT_EQ((*j)["a"][1]["b"], "x[{\"]");
  EXPECT_EQ((*j)["c"].get<double>(), 1000.0);
}

TEST(ParseJson, RefusesDeepNestingWithoutRecursing) {
  const std::string deep = std::string(1000000, '[') + std::string(1000000, ']');
  auto j = ParseJson(deep, "body of request 7");
  ASSERT_FALSE(j.ok());
  EXPECT_NE(j.status().message().find("body of request 7"), std::string::npos);
  EXPECT_NE(j.status().message().find("nested deeper than 64"), std::string::npos);
  // Exactly at the bound is fine; brackets inside strings do not count.
  EXPECT_TRUE(ParseJson(std::string(64, '[') + std::string(64, ']'), "x").ok());
  EXPECT_FALSE(ParseJson(std::string(65, '[') + std::string(65, ']'), "x").ok());
  EXPECT_TRUE(ParseJson("[\"" + std::string(500, '{') + "\"]", "x").ok());
}

TEST(ParseJson, NumberOverflowAndSyntaxErrorsAreStatuses) {
  auto big = ParseJson(R"({"v": 1e999})", "tokenizer.json");
  ASSERT_FALSE(big.ok());
  EXPECT_NE(big.status().message().find("tokenizer.json"), std::string::npos);
  auto bad = ParseJson("{\"v\": ", "config.json");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("config.json: invalid JSON"), std::string::npos);
  EXPECT_FALSE(ParseJson("", "empty").ok());
}

}  // namespace
}  // namespace hsx
