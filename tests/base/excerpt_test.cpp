// excerpt(): how error messages quote input, and the TOML reader's use of it.
#include "lockstep/base/excerpt.h"

#include <gtest/gtest.h>

#include <string>

#include "lockstep/base/error.h"
#include "lockstep/base/toml_section.h"

namespace lockstep {
namespace {

TEST(Excerpt, ShortPrintableTextIsUnchanged) {
  EXPECT_EQ(excerpt("train.lr"), "train.lr");
  EXPECT_EQ(excerpt("caf\xC3\xA9 \xE4\xB8\xAD"), "caf\xC3\xA9 \xE4\xB8\xAD");  // UTF-8 stays readable
  EXPECT_EQ(excerpt(""), "");
}

TEST(Excerpt, ControlAndInvalidBytesAreEscaped) {
  EXPECT_EQ(excerpt(std::string("a\0b", 3)), "a\\x00b");
  EXPECT_EQ(excerpt("t\x0bype\x1b[2J"), "t\\x0bype\\x1b[2J");
  EXPECT_EQ(excerpt("\x7f"), "\\x7f");
  EXPECT_EQ(excerpt("\xff\xC3"), "\\xff\\xc3");           // invalid, and a lead byte cut off
  EXPECT_EQ(excerpt("\xED\xA0\x80"), "\\xed\\xa0\\x80");  // a surrogate is not UTF-8
  EXPECT_EQ(excerpt("\xC0\xAF"), "\\xc0\\xaf");           // overlong
}

TEST(Excerpt, LongTextIsCutWithItsLength) {
  const std::string big(100000, 'x');
  EXPECT_EQ(excerpt(big, 8), "xxxxxxxx... (100000 bytes)");
  EXPECT_EQ(excerpt(big).size(), 64 + std::string("... (100000 bytes)").size());
  // Never in the middle of a character.
  EXPECT_EQ(excerpt("ab\xE4\xB8\xAD", 4), "ab... (5 bytes)");
}

// Found by tests/fuzz/targets/toml.cpp: TOML keys and values are quoted in
// errors; a quoted key may hold any byte ("t\u000bype").
TEST(Excerpt, TomlErrorsQuoteKeysAndValuesPrintably) {
  const toml::table root =
      parse_toml_with_overrides("[log]\n\"t\\u000bype\" = 1\nmode = \"a\\u001bb\"\n", "x.toml", {});
  TomlSection s(root["log"].as_table(), "x.toml", "log");
  try {
    s.get_enum("mode", "a", {"a", "b"});
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'a\\x1bb' is not one of: a, b"), std::string::npos) << e.what();
  }
  try {
    s.finish();
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("unknown key 't\\x0bype' in [log]"), std::string::npos) << e.what();
  }
  try {
    parse_toml_with_overrides("", "x.toml", {std::string(5000, '\x01')});
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_LT(std::string(e.what()).size(), 400u) << e.what();  // 64 bytes, each as \\xNN
    EXPECT_NE(std::string(e.what()).find("\\x01\\x01"), std::string::npos) << e.what();
  }
}

// Found by tests/fuzz/targets/toml.cpp (UBSan): get_int converted a float to
// int64 before it checked the type, undefined for 5e40.
TEST(TomlSectionFuzz, FloatForAnIntegerIsAnError) {
  const toml::table root =
      parse_toml_with_overrides("[data]\nmax_prompt_len = 5e40\nn = 2.0\n", "x.toml", {});
  TomlSection s(root["data"].as_table(), "x.toml", "data");
  EXPECT_THROW(s.get_int("max_prompt_len", 0), Error);
  EXPECT_THROW(s.get_int("n", 0), Error);
}

}  // namespace
}  // namespace lockstep
