// Tests of the BPE model: hand-derived merges, ignore_merges, byte fallback,
// unk handling, the merge forms of tokenizer.json, load errors, and a
// randomized comparison with an independent slow BPE (fixtures.h).
#include <gtest/gtest.h>

#include "fixtures.h"
#include "lockstep/base/error.h"
#include "lockstep/tokenizer/bpe.h"

namespace lockstep::tokenizer {
namespace {

std::vector<int32_t> enc(const BpeModel& m, const std::string& piece) {
  std::vector<int32_t> out;
  m.encode(piece, out);
  return out;
}

Vocab letters(const std::string& chars) {
  Vocab v;
  for (size_t i = 0; i < chars.size(); ++i) v[std::string(1, chars[i])] = static_cast<int32_t>(i);
  return v;
}

TEST(Bpe, MergesLowestRankFirst) {
  // a=0 b=1 c=2; merges: "b c" (rank 0) -> bc=3, "a b" (rank 1) -> ab=4, "a bc" (rank 2) -> abc=5.
  Vocab v = letters("abc");
  v["bc"] = 3;
  v["ab"] = 4;
  v["abc"] = 5;
  BpeModel m = BpeModel::from_parts(v, {{"b", "c"}, {"a", "b"}, {"a", "bc"}});
  EXPECT_EQ(enc(m, "abc"), (std::vector<int32_t>{5}));       // b c first, then a bc
  EXPECT_EQ(enc(m, "ab"), (std::vector<int32_t>{4}));
  EXPECT_EQ(enc(m, "abab"), (std::vector<int32_t>{4, 4}));
  EXPECT_EQ(enc(m, "cab"), (std::vector<int32_t>{2, 4}));
  EXPECT_EQ(enc(m, "abcabc"), (std::vector<int32_t>{5, 5}));
  EXPECT_EQ(enc(m, ""), (std::vector<int32_t>{}));
}

TEST(Bpe, TiesGoToTheLeftmostPair) {
  // "aaa" with "a a" -> aa: the left pair merges, leaving "aa a".
  Vocab v = letters("a");
  v["aa"] = 1;
  BpeModel m = BpeModel::from_parts(v, {{"a", "a"}});
  EXPECT_EQ(enc(m, "aaa"), (std::vector<int32_t>{1, 0}));
  EXPECT_EQ(enc(m, "aaaa"), (std::vector<int32_t>{1, 1}));
  EXPECT_EQ(enc(m, "aaaaa"), (std::vector<int32_t>{1, 1, 0}));
}

TEST(Bpe, IgnoreMergesEmitsWholeVocabularyWords) {
  // "abc" is in the vocab, but no merge chain builds it: with ignore_merges the
  // whole piece is one token, without it the merges decide.
  Vocab v = letters("abc");
  v["ab"] = 3;
  v["abc"] = 4;
  BpeModel with = BpeModel::from_parts(v, {{"a", "b"}}, /*ignore_merges=*/true);
  BpeModel without = BpeModel::from_parts(v, {{"a", "b"}}, /*ignore_merges=*/false);
  EXPECT_EQ(enc(with, "abc"), (std::vector<int32_t>{4}));
  EXPECT_EQ(enc(without, "abc"), (std::vector<int32_t>{3, 2}));
  EXPECT_EQ(enc(with, "abca"), (std::vector<int32_t>{3, 2, 0}));
}

TEST(Bpe, ByteFallbackAndUnk) {
  Vocab v = letters("ab");
  v["<unk>"] = 2;
  v["<0xC3>"] = 3;
  v["<0xA9>"] = 4;
  // byte fallback: 'é' = C3 A9 becomes two byte tokens; 'ü' (C3 BC) lacks <0xBC> -> unk.
  BpeModel fb = BpeModel::from_parts(v, {}, false, /*byte_fallback=*/true, "<unk>");
  EXPECT_EQ(enc(fb, "a\xC3\xA9" "b"), (std::vector<int32_t>{0, 3, 4, 1}));
  EXPECT_EQ(enc(fb, "a\xC3\xBC" "b"), (std::vector<int32_t>{0, 2, 1}));
  // Without byte fallback: one unk per unknown character, or one per run with fuse_unk.
  BpeModel unk = BpeModel::from_parts(v, {}, false, false, "<unk>", /*fuse_unk=*/false);
  BpeModel fused = BpeModel::from_parts(v, {}, false, false, "<unk>", /*fuse_unk=*/true);
  EXPECT_EQ(enc(unk, "a\xC3\xA9\xC3\xBC" "b"), (std::vector<int32_t>{0, 2, 2, 1}));
  EXPECT_EQ(enc(fused, "a\xC3\xA9\xC3\xBC" "b"), (std::vector<int32_t>{0, 2, 1}));
  // Without an unk token, unknown characters are dropped (as in HF).
  BpeModel none = BpeModel::from_parts(v, {});
  EXPECT_EQ(enc(none, "a\xC3\xA9" "b"), (std::vector<int32_t>{0, 1}));
}

TEST(Bpe, LoadsBothMergeFormsAndContinuingPrefix) {
  Json model = {{"type", "BPE"},
                {"vocab", {{"a", 0}, {"##b", 1}, {"ab", 2}, {"b", 3}}},
                {"merges", Json::array({Json::array({"a", "##b"})})},
                {"continuing_subword_prefix", "##"}};
  BpeModel m = BpeModel::from_json(model, "t.json: model");
  EXPECT_EQ(enc(m, "ab"), (std::vector<int32_t>{2}));
  EXPECT_EQ(enc(m, "ba"), (std::vector<int32_t>{3}));  // "##a" is unknown and dropped
  model["merges"] = Json::array({"a ##b"});
  BpeModel m2 = BpeModel::from_json(model, "t.json: model");
  EXPECT_EQ(enc(m2, "ab"), (std::vector<int32_t>{2}));
}

void expect_error(const Json& model, const std::string& needle) {
  try {
    BpeModel::from_json(model, "dir/tokenizer.json: model");
    ADD_FAILURE() << "expected an error mentioning " << needle;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(Bpe, BadModelsFailLoudlyNamingTheField) {
  Json ok = {{"type", "BPE"}, {"vocab", {{"a", 0}, {"b", 1}, {"ab", 2}}}, {"merges", Json::array({"a b"})}};
  Json m = ok;
  m["type"] = "WordPiece";
  expect_error(m, "model.type: model type 'WordPiece' is not supported");
  m = ok;
  m["merges"] = Json::array({"a c"});
  expect_error(m, "model.merges[0]: token 'c' is not in the vocabulary");
  m = ok;
  m["merges"] = Json::array({"a b", "b a"});
  expect_error(m, "model.merges[1]: merged token 'ba' is not in the vocabulary");
  m = ok;
  m["merges"] = Json::array({"ab"});
  expect_error(m, "model.merges[0]: expected");
  m = ok;
  m["dropout"] = 0.1;
  expect_error(m, "model.dropout");
  m = ok;
  m.erase("vocab");
  expect_error(m, "model.vocab: missing");
}

TEST(Bpe, MatchesIndependentReferenceOnRandomWords) {
  // A random merge table over a small alphabet; every piece must encode like
  // the slow string BPE, through the heap path, the cache and the quadratic loop.
  std::mt19937 rng(7);
  const std::string alphabet = "abcde";
  Vocab v = letters(alphabet);
  std::vector<std::pair<std::string, std::string>> merges;
  std::map<std::pair<std::string, std::string>, int> ranks;
  std::vector<std::string> tokens;
  for (char c : alphabet) tokens.emplace_back(1, c);
  while (merges.size() < 60) {
    const std::string& a = tokens[rng() % tokens.size()];
    const std::string& b = tokens[rng() % tokens.size()];
    if (a.size() + b.size() > 6 || ranks.count({a, b}) || v.count(a + b)) continue;
    ranks[{a, b}] = static_cast<int>(merges.size());
    merges.emplace_back(a, b);
    v[a + b] = static_cast<int32_t>(v.size());
    tokens.push_back(a + b);
  }
  BpeModel m = BpeModel::from_parts(v, merges);
  for (int trial = 0; trial < 3000; ++trial) {
    std::string word;
    size_t len = 1 + rng() % 40;
    for (size_t i = 0; i < len; ++i) word.push_back(alphabet[rng() % alphabet.size()]);
    std::vector<int32_t> want;
    for (const auto& t : test::reference_bpe(word, ranks)) want.push_back(v.at(t));
    std::vector<int32_t> fast, again, slow;
    m.encode(word, fast);
    m.encode(word, again);  // second call is served by the cache
    m.encode_reference(word, slow);
    ASSERT_EQ(fast, want) << word;
    ASSERT_EQ(again, want) << word;
    ASSERT_EQ(slow, want) << word;
  }
}

TEST(Bpe, LongWordsDoNotBlowUp) {
  // 200k symbols: the heap merge is O(n log n) (the quadratic loop would take minutes).
  Vocab v = letters("ab");
  v["ab"] = 2;
  v["abab"] = 3;
  BpeModel m = BpeModel::from_parts(v, {{"a", "b"}, {"ab", "ab"}});
  std::string word;
  for (int i = 0; i < 100000; ++i) word += "ab";
  std::vector<int32_t> out;
  m.encode(word, out);
  ASSERT_EQ(out.size(), 50000u);
  for (int32_t id : out) ASSERT_EQ(id, 3);
}

}  // namespace
}  // namespace lockstep::tokenizer
