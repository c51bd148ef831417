// Tests of the pre-tokenizers: the split patterns of GPT-2, Llama 3 and
// DeepSeek-V3 run through PCRE2, every Split behaviour (with invert), Digits,
// Whitespace, ByteLevel and Oniguruma-style handling of empty matches.
#include <gtest/gtest.h>

#include "fixtures.h"
#include "lockstep/base/error.h"
#include "lockstep/tokenizer/pre_tokenizer.h"

namespace lockstep::tokenizer {
namespace {

using Pieces = std::vector<std::string>;

const char* kLlama3Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

Pieces run(const Json& spec, const std::string& text) {
  auto pt = make_pre_tokenizer(spec, "t.json: pre_tokenizer");
  Pieces p{text};
  pt->apply(p);
  return p;
}

Json split(const std::string& pattern, const std::string& behavior, bool invert = false, bool literal = false) {
  return {{"type", "Split"},
          {"pattern", {{literal ? "String" : "Regex", pattern}}},
          {"behavior", behavior},
          {"invert", invert}};
}

TEST(PreTokenizer, Gpt2Pattern) {
  Pieces got = run(split(kGpt2SplitPattern, "Isolated"), "Hello world, it's 12345 days!  ok\n\nx I'M");
  EXPECT_EQ(got, (Pieces{"Hello", " world", ",", " it", "'s", " 12345", " days", "!", " ", " ok", "\n", "\n", "x", " I",
                         "'", "M"}));
}

TEST(PreTokenizer, Llama3Pattern) {
  Pieces got = run(split(kLlama3Pattern, "Isolated"), "Hello world, it's 12345 days!  ok\n\nx I'M");
  EXPECT_EQ(got, (Pieces{"Hello", " world", ",", " it", "'s", " ", "123", "45", " days", "!", " ", " ok", "\n\n", "x",
                         " I", "'M"}));
  // Unicode classes: letters and digits of any script; \s includes U+0085 and
  // U+3000, and a lone non-letter joins the letters after it.
  got = run(split(kLlama3Pattern, "Isolated"), "\xE6\x97\xA5\xE6\x9C\xAC \xD9\xA1\xD9\xA2\xD9\xA3\xD9\xA4\xC2\x85\xE3\x80\x80x");
  EXPECT_EQ(got, (Pieces{"\xE6\x97\xA5\xE6\x9C\xAC", " ", "\xD9\xA1\xD9\xA2\xD9\xA3", "\xD9\xA4", "\xC2\x85",
                         "\xE3\x80\x80x"}));
}

TEST(PreTokenizer, DeepSeekV3Sequence) {
  Json seq = {{"type", "Sequence"},
              {"pretokenizers",
               {split(R"(\p{N}{1,3})", "Isolated"),
                split("[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+", "Isolated"),
                split("[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| "
                      "?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+",
                      "Isolated")}}};
  Pieces got = run(seq, "abc 12345 \xE4\xB8\xAD\xE6\x96\x87x .git");
  EXPECT_EQ(got, (Pieces{"abc", " ", "123", "45", " ", "\xE4\xB8\xAD\xE6\x96\x87", "x", " .", "git"}));
}

TEST(PreTokenizer, SplitBehaviours) {
  const std::string text = "the-final--countdown";
  EXPECT_EQ(run(split("-", "Removed", false, true), text), (Pieces{"the", "final", "countdown"}));
  EXPECT_EQ(run(split("-", "Isolated", false, true), text), (Pieces{"the", "-", "final", "-", "-", "countdown"}));
  EXPECT_EQ(run(split("-", "MergedWithPrevious", false, true), text), (Pieces{"the-", "final-", "-", "countdown"}));
  EXPECT_EQ(run(split("-", "MergedWithNext", false, true), text), (Pieces{"the", "-final", "-", "-countdown"}));
  EXPECT_EQ(run(split("-", "Contiguous", false, true), text), (Pieces{"the", "-", "final", "--", "countdown"}));
  // invert: the gaps are the delimiters.
  EXPECT_EQ(run(split("-", "Removed", true, true), text), (Pieces{"-", "-", "-"}));
  EXPECT_EQ(run(split("[a-z]+", "Removed", true), text), (Pieces{"the", "final", "countdown"}));
  EXPECT_EQ(run(split("-", "MergedWithPrevious", true, true), "-a-b"), (Pieces{"-a", "-b"}));
  // An empty String pattern splits nothing.
  EXPECT_EQ(run(split("", "Removed", false, true), text), (Pieces{text}));
}

TEST(PreTokenizer, EmptyMatchesAdvanceLikeOniguruma) {
  // a* on "baab" matches (0,0), (1,3), (4,4): no endless loop, no lost text.
  EXPECT_EQ(run(split("a*", "Isolated"), "baab"), (Pieces{"b", "aa", "b"}));
  EXPECT_EQ(run(split("a*", "Removed"), "baab"), (Pieces{"b", "b"}));
  EXPECT_EQ(run(split("(?=b)", "Isolated"), "abab"), (Pieces{"a", "ba", "b"}));
}

TEST(PreTokenizer, DigitsWhitespacePunctuation) {
  EXPECT_EQ(run({{"type", "Digits"}, {"individual_digits", true}}, "a123b"), (Pieces{"a", "1", "2", "3", "b"}));
  EXPECT_EQ(run({{"type", "Digits"}, {"individual_digits", false}}, "a123b4"), (Pieces{"a", "123", "b", "4"}));
  EXPECT_EQ(run({{"type", "Whitespace"}}, "Hey friend!     How are you?!?"),
            (Pieces{"Hey", "friend", "!", "How", "are", "you", "?!?"}));
  EXPECT_EQ(run({{"type", "WhitespaceSplit"}}, " a\tb\xC2\xA0" "c "), (Pieces{"a", "b", "c"}));
  EXPECT_EQ(run({{"type", "Punctuation"}}, "Hi,you!"), (Pieces{"Hi", ",", "you", "!"}));
}

TEST(PreTokenizer, ByteLevelMapsBytesAndAddsPrefixSpace) {
  EXPECT_EQ(run(test::byte_level_pre(false, true), "Hello world\n"), (Pieces{"Hello", "\xC4\xA0world", "\xC4\x8A"}));
  // add_prefix_space: a space is added to each piece that reaches ByteLevel.
  Json seq = {{"type", "Sequence"}, {"pretokenizers", {split(" ", "Removed", false, true), test::byte_level_pre(true, false)}}};
  EXPECT_EQ(run(seq, "ab cd"), (Pieces{"\xC4\xA0" "ab", "\xC4\xA0" "cd"}));
  EXPECT_EQ(run(test::byte_level_pre(false, false), "\xC3\xA9"), (Pieces{"\xC3\x83\xC2\xA9"}));
}

TEST(PreTokenizer, UnsupportedTypesAndBehavioursNameTheField) {
  try {
    run({{"type", "Metaspace"}}, "x");
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("t.json: pre_tokenizer.type: pre-tokenizer 'Metaspace' is not supported"),
              std::string::npos)
        << e.what();
  }
  try {
    run({{"type", "Sequence"}, {"pretokenizers", {split("a", "Sideways")}}}, "x");
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("pre_tokenizer.pretokenizers[0].behavior"), std::string::npos) << e.what();
  }
  try {
    run(split("(unclosed", "Isolated"), "x");
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("pre_tokenizer.pattern: cannot compile"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace lockstep::tokenizer
