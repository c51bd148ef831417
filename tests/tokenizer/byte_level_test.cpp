// Tests of the GPT-2 byte alphabet and of write_byte_level_tokenizer, the
// merge-free tokenizer lockstep writes for its tiny models.
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

#include "fixtures.h"
#include "lockstep/base/error.h"
#include "lockstep/tokenizer/unicode.h"

namespace lockstep::tokenizer {
namespace {

TEST(ByteLevel, AlphabetIsTheGpt2Map) {
  EXPECT_EQ(byte_to_unicode(' '), 0x120u);   // 'Ġ'
  EXPECT_EQ(byte_to_unicode('\n'), 0x10Au);  // 'Ċ'
  EXPECT_EQ(byte_to_unicode('\t'), 0x109u);  // 'ĉ'
  EXPECT_EQ(byte_to_unicode(0), 0x100u);
  EXPECT_EQ(byte_to_unicode('A'), static_cast<uint32_t>('A'));
  EXPECT_EQ(byte_to_unicode(0x7F), 0x121u);
  EXPECT_EQ(byte_to_unicode(0xAD), 0x143u);  // the last of the 68 remapped bytes
  EXPECT_EQ(byte_to_unicode(0xE9), 0xE9u);
  std::set<uint32_t> seen;
  for (int b = 0; b < 256; ++b) {
    uint32_t cp = byte_to_unicode(static_cast<uint8_t>(b));
    EXPECT_TRUE(seen.insert(cp).second);
    EXPECT_EQ(unicode_to_byte(cp), b);
  }
  EXPECT_EQ(unicode_to_byte(0x144), -1);
  std::string all;
  for (int b = 0; b < 256; ++b) all.push_back(static_cast<char>(b));
  std::string enc, dec;
  byte_level_encode(all, enc);
  EXPECT_TRUE(utf8_is_valid(enc));
  EXPECT_TRUE(byte_level_decode(enc, dec));
  EXPECT_EQ(dec, all);
}

TEST(ByteLevel, WrittenTokenizerEncodesBytes) {
  test::TempDir dir;
  write_byte_level_tokenizer(dir.path() / "model");
  Tokenizer t = Tokenizer::load(dir.path() / "model");
  EXPECT_EQ(t.vocab_size(), 259);
  EXPECT_EQ(t.token_to_id("<|endoftext|>"), 256);
  EXPECT_EQ(t.token_to_id("<|im_start|>"), 257);
  EXPECT_EQ(t.token_to_id("<|im_end|>"), 258);
  EXPECT_EQ(t.eos_id(), 258);
  EXPECT_EQ(t.pad_id(), 256);
  EXPECT_EQ(t.bos_id(), std::nullopt);
  const std::string text = "Hi \xF0\x9F\xA4\x96\n  x";
  std::vector<int32_t> want;
  for (unsigned char c : text) want.push_back(c);
  EXPECT_EQ(t.encode(text), want);
  EXPECT_EQ(t.encode(text, /*add_special_tokens=*/true), want);
  EXPECT_EQ(t.decode(want), text);
  EXPECT_EQ(t.encode("a<|im_end|>"), (std::vector<int32_t>{'a', 258}));
  EXPECT_EQ(t.decode(std::vector<int32_t>{'a', 258}, true), "a");
  EXPECT_EQ(t.chat_template().name(), "chatml");
  EXPECT_EQ(t.encode_chat({{"user", "q"}}).front(), 257);
}

TEST(ByteLevel, WriterTakesOtherSpecialsAndRejectsBadOnes) {
  test::TempDir dir;
  write_byte_level_tokenizer(dir.path(), {"<pad>", "<eos>"});
  Tokenizer t = Tokenizer::load(dir.path());
  EXPECT_EQ(t.token_to_id("<eos>"), 257);
  EXPECT_EQ(t.eos_id(), 257);  // no <|im_end|>: the last special
  EXPECT_EQ(t.pad_id(), 257);  // no <|endoftext|>: eos
  EXPECT_THROW(write_byte_level_tokenizer(dir.path(), {"<a>", "<a>"}), Error);
  EXPECT_THROW(write_byte_level_tokenizer(dir.path(), {""}), Error);
  EXPECT_THROW(write_byte_level_tokenizer(dir.path(), {"x"}), Error);
}

TEST(ByteLevel, FillerPiecesArePairsThenTriplesInOrder) {
  const std::vector<std::string> p = ascii_filler_pieces(95 * 95 + 2);
  ASSERT_EQ(p.size(), 95u * 95u + 2u);
  EXPECT_EQ(p[0], "  ");
  EXPECT_EQ(p[1], " !");
  EXPECT_EQ(p[95], "! ");
  EXPECT_EQ(p[95 * 95 - 1], "~~");
  EXPECT_EQ(p[95 * 95], "   ");  // every pair written: the triples start
  EXPECT_EQ(p[95 * 95 + 1], "  !");
  EXPECT_EQ(std::set<std::string>(p.begin(), p.end()).size(), p.size());
  EXPECT_TRUE(ascii_filler_pieces(0).empty());
  EXPECT_TRUE(ascii_filler_pieces(-3).empty());
}

TEST(ByteLevel, VocabSizeIsCoveredAndEncodingUnchanged) {
  test::TempDir dir;
  write_byte_level_tokenizer(dir.path(), {"<|endoftext|>", "<|im_start|>", "<|im_end|>"}, 10000);
  Tokenizer t = Tokenizer::load(dir.path());
  EXPECT_EQ(t.vocab_size(), 10000);
  for (int32_t id : {259, 5000, 9999}) {
    ASSERT_TRUE(t.id_to_token(id)) << id;
    EXPECT_FALSE(t.decode(std::vector<int32_t>{id}).empty()) << id;
  }
  EXPECT_EQ(t.decode(std::vector<int32_t>{259}), "  ");
  EXPECT_EQ(t.decode(std::vector<int32_t>{259 + 95 * 95}), "   ");
  // Texts made of filler pieces still encode byte by byte.
  EXPECT_EQ(t.encode("ab  x"), (std::vector<int32_t>{'a', 'b', ' ', ' ', 'x'}));
  EXPECT_EQ(t.token_to_id("<|im_end|>"), 258);
}

}  // namespace
}  // namespace lockstep::tokenizer
