// Tests of UTF-8 repair and the Unicode operations behind the normalizers.
// Expected strings were produced with Python's unicodedata (the same Unicode
// version the tables come from) and written here as byte escapes.
#include <gtest/gtest.h>

#include "lockstep/tokenizer/unicode.h"

namespace lockstep::tokenizer {
namespace {

struct NormCase {
  const char* in;
  const char* nfc;
  const char* nfd;
  const char* nfkc;
  const char* nfkd;
};

const NormCase kNormCases[] = {
    {"e\xCC\x81", "\xC3\xA9", "e\xCC\x81", "\xC3\xA9", "e\xCC\x81"},
    {"cafe\xCC\x81 \xC3\x85 \xE2\x84\xAB", "caf\xC3\xA9 \xC3\x85 \xC3\x85", "cafe\xCC\x81 A\xCC\x8A A\xCC\x8A", "caf\xC3\xA9 \xC3\x85 \xC3\x85", "cafe\xCC\x81 A\xCC\x8A A\xCC\x8A"},
    {"\xE1\x84\x80\xE1\x85\xA1\xE1\x86\xA8", "\xEA\xB0\x81", "\xE1\x84\x80\xE1\x85\xA1\xE1\x86\xA8", "\xEA\xB0\x81", "\xE1\x84\x80\xE1\x85\xA1\xE1\x86\xA8"},
    {"\xED\x95\x9C\xEA\xB5\xAD", "\xED\x95\x9C\xEA\xB5\xAD", "\xE1\x84\x92\xE1\x85\xA1\xE1\x86\xAB\xE1\x84\x80\xE1\x85\xAE\xE1\x86\xA8", "\xED\x95\x9C\xEA\xB5\xAD", "\xE1\x84\x92\xE1\x85\xA1\xE1\x86\xAB\xE1\x84\x80\xE1\x85\xAE\xE1\x86\xA8"},
    {"a\xCC\xA3\xCC\x82", "\xE1\xBA\xAD", "a\xCC\xA3\xCC\x82", "\xE1\xBA\xAD", "a\xCC\xA3\xCC\x82"},
    {"a\xCC\x82\xCC\xA3", "\xE1\xBA\xAD", "a\xCC\xA3\xCC\x82", "\xE1\xBA\xAD", "a\xCC\xA3\xCC\x82"},
    {"\xEF\xAC\x81 \xE2\x91\xA0 \xEF\xBD\xB1 \xC2\xBD x\xC2\xB2", "\xEF\xAC\x81 \xE2\x91\xA0 \xEF\xBD\xB1 \xC2\xBD x\xC2\xB2", "\xEF\xAC\x81 \xE2\x91\xA0 \xEF\xBD\xB1 \xC2\xBD x\xC2\xB2", "fi 1 \xE3\x82\xA2 1\xE2\x81\x84" "2 x2", "fi 1 \xE3\x82\xA2 1\xE2\x81\x84" "2 x2"},
    {"\xE0\xA5\x98", "\xE0\xA4\x95\xE0\xA4\xBC", "\xE0\xA4\x95\xE0\xA4\xBC", "\xE0\xA4\x95\xE0\xA4\xBC", "\xE0\xA4\x95\xE0\xA4\xBC"},
    {"\xCD\x84", "\xCC\x88\xCC\x81", "\xCC\x88\xCC\x81", "\xCC\x88\xCC\x81", "\xCC\x88\xCC\x81"},
    {"\xE1\xBA\x9B\xCC\xA3", "\xE1\xBA\x9B\xCC\xA3", "\xC5\xBF\xCC\xA3\xCC\x87", "\xE1\xB9\xA9", "s\xCC\xA3\xCC\x87"},
    {"\xCC\x81" "abc", "\xCC\x81" "abc", "\xCC\x81" "abc", "\xCC\x81" "abc", "\xCC\x81" "abc"},
    {"\xD6\xB8\xD6\xB9\xD6\xB1\xD6\x91\xD7\x83\xD6\xB0\xD6\xAC\xD6\x9F", "\xD6\xB1\xD6\xB8\xD6\xB9\xD6\x91\xD7\x83\xD6\xB0\xD6\xAC\xD6\x9F", "\xD6\xB1\xD6\xB8\xD6\xB9\xD6\x91\xD7\x83\xD6\xB0\xD6\xAC\xD6\x9F", "\xD6\xB1\xD6\xB8\xD6\xB9\xD6\x91\xD7\x83\xD6\xB0\xD6\xAC\xD6\x9F", "\xD6\xB1\xD6\xB8\xD6\xB9\xD6\x91\xD7\x83\xD6\xB0\xD6\xAC\xD6\x9F"},
    {"\xF0\x9D\x85\x9E", "\xF0\x9D\x85\x97\xF0\x9D\x85\xA5", "\xF0\x9D\x85\x97\xF0\x9D\x85\xA5", "\xF0\x9D\x85\x97\xF0\x9D\x85\xA5", "\xF0\x9D\x85\x97\xF0\x9D\x85\xA5"},
    {"\xCE\xA9 K \xC3\x85", "\xCE\xA9 K \xC3\x85", "\xCE\xA9 K A\xCC\x8A", "\xCE\xA9 K \xC3\x85", "\xCE\xA9 K A\xCC\x8A"},
};

TEST(Unicode, NormalFormsMatchPython) {
  for (const auto& c : kNormCases) {
    EXPECT_EQ(normalize(c.in, NormalForm::NFC), c.nfc) << c.in;
    EXPECT_EQ(normalize(c.in, NormalForm::NFD), c.nfd) << c.in;
    EXPECT_EQ(normalize(c.in, NormalForm::NFKC), c.nfkc) << c.in;
    EXPECT_EQ(normalize(c.in, NormalForm::NFKD), c.nfkd) << c.in;
  }
}

TEST(Unicode, NormalizationIsIdempotentAndAsciiInvariant) {
  for (const auto& c : kNormCases) {
    EXPECT_EQ(normalize(c.nfc, NormalForm::NFC), c.nfc);
    EXPECT_EQ(normalize(c.nfd, NormalForm::NFD), c.nfd);
  }
  std::string ascii;
  for (int i = 0; i < 128; ++i) ascii.push_back(static_cast<char>(i));
  for (auto f : {NormalForm::NFC, NormalForm::NFD, NormalForm::NFKC, NormalForm::NFKD}) EXPECT_EQ(normalize(ascii, f), ascii);
}

TEST(Unicode, LowercaseIsPerCharacter) {
  // Final sigma is not context-mapped (Rust char::to_lowercase), and U+0130
  // lowercases to two code points.
  EXPECT_EQ(to_lowercase("ABC \xC3\x9Cn\xC3\xAF \xCE\xA3\xCE\x91\xCE\xA3 \xC4\xB0 \xC7\x84 \xE2\x85\xAB \xEF\xBC\xA1\xEF\xBC\xA2 \xCE\xA9"), "abc \xC3\xBCn\xC3\xAF \xCF\x83\xCE\xB1\xCF\x83 i\xCC\x87 \xC7\x86 \xE2\x85\xBB \xEF\xBD\x81\xEF\xBD\x82 \xCF\x89");
}

TEST(Unicode, SanitizeReplacesMaximalSubparts) {
  // Python: bytes.decode("utf-8", errors="replace").
  EXPECT_EQ(utf8_sanitize("a\xE2\x82" "Ab"), "a\xEF\xBF\xBD" "Ab");
  EXPECT_EQ(utf8_sanitize("\xFF\xFE"), "\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_EQ(utf8_sanitize("\xE0\x80\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // overlong
  EXPECT_EQ(utf8_sanitize("\xED\xA0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // surrogate
  EXPECT_EQ(utf8_sanitize("\xF0\x9F\x98"), "\xEF\xBF\xBD");                          // truncated emoji
  EXPECT_EQ(utf8_sanitize("\xF4\x90\x80\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // > U+10FFFF
  EXPECT_EQ(utf8_sanitize("\xC0\xAF"), "\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_EQ(utf8_sanitize("ok\xE2\x82"), "ok\xEF\xBF\xBD");
  EXPECT_EQ(utf8_sanitize(std::string("a\0b", 3)), std::string("a\0b", 3));  // NUL is valid UTF-8
  const char* valid = "h\xC3\xA9llo \xF0\x9F\x98\x80 \xE4\xB8\xAD";
  EXPECT_TRUE(utf8_is_valid(valid));
  EXPECT_EQ(utf8_sanitize(valid), valid);
}

TEST(Unicode, Utf8StepReportsTruncation) {
  Utf8Step st = utf8_next("\xF0\x9F\x98", 0);
  EXPECT_FALSE(st.valid);
  EXPECT_TRUE(st.truncated);
  EXPECT_EQ(st.len, 3u);
  st = utf8_next("\xF0\x9F" "A", 0);
  EXPECT_FALSE(st.truncated);
  EXPECT_EQ(st.len, 2u);
  st = utf8_next("\xF0\x9F\x98\x80", 0);
  EXPECT_TRUE(st.valid);
  EXPECT_EQ(st.cp, 0x1F600u);
}

TEST(Unicode, WhiteSpaceIsTheUnicodeProperty) {
  for (uint32_t cp : {0x09u, 0x0Au, 0x0Du, 0x20u, 0x85u, 0xA0u, 0x1680u, 0x2000u, 0x200Au, 0x2028u, 0x3000u})
    EXPECT_TRUE(is_white_space(cp)) << cp;
  for (uint32_t cp : {0x1Cu, 0x200Bu, 0x41u, 0xFEFFu, 0x180Eu}) EXPECT_FALSE(is_white_space(cp)) << cp;
}

TEST(Unicode, RandomStringsSurviveEveryForm) {
  // Normalizing arbitrary code points must never crash and must give valid UTF-8.
  uint32_t state = 12345;
  for (int trial = 0; trial < 200; ++trial) {
    std::string s;
    for (int i = 0; i < 20; ++i) {
      state = state * 1103515245u + 12345u;
      uint32_t cp = (state >> 8) % 0x11000;
      if (cp >= 0xD800 && cp < 0xE000) cp = 0x301;
      utf8_append(s, cp);
    }
    for (auto f : {NormalForm::NFC, NormalForm::NFD, NormalForm::NFKC, NormalForm::NFKD}) {
      std::string n = normalize(s, f);
      EXPECT_TRUE(utf8_is_valid(n));
      EXPECT_EQ(normalize(n, f), n);
    }
  }
}

}  // namespace
}  // namespace lockstep::tokenizer
