// End-to-end tests of Tokenizer on tokenizer.json fixtures built here: ids
// derived by hand from known merges, round trips (multilingual, emoji,
// whitespace runs, digits, contractions, special tokens, invalid UTF-8), added
// token rules, post-processing, decoding, streaming and load errors.
#include <gtest/gtest.h>

#include "fixtures.h"
#include "lockstep/base/error.h"
#include "lockstep/tokenizer/bpe.h"
#include "lockstep/tokenizer/pre_tokenizer.h"
#include "lockstep/tokenizer/unicode.h"

#include <atomic>
#include <thread>

namespace lockstep::tokenizer {
namespace {

using test::bl;
using test::BpeFixture;
using Ids = std::vector<int32_t>;

const char* kLlama3Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// GPT-2 style: ByteLevel pre-tokenizer with its built-in regex, a few merges.
BpeFixture gpt2_fixture() {
  BpeFixture f;
  f.merges = {{bl(" "), "t"}, {"h", "e"},  {bl(" t"), "he"},  {"i", "n"},     {"in", "g"},
              {bl(" "), bl(" ")}, {bl("  "), bl("  ")}, {"'", "s"}, {"1", "2"}, {bl("\n"), bl("\n")}};
  f.added_tokens = Json::array({test::added_token(266, "<|endoftext|>"), test::added_token(267, "<|im_start|>"),
                                test::added_token(268, "<|im_end|>"), test::added_token(269, "<tool>", false)});
  return f;
}

const std::vector<std::string> kRoundTripTexts = {
    "Hello world, it's 12345 days!",
    "\xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E\xE3\x81\xAE\xE3\x83\x86\xE3\x82\xAD\xE3\x82\xB9\xE3\x83\x88 \xE4\xB8\xAD\xE6\x96\x87",
    "\xD0\x9F\xD1\x80\xD0\xB8\xD0\xB2\xD0\xB5\xD1\x82 \xD9\x85\xD8\xB1\xD8\xAD\xD8\xA8\xD8\xA7 \xE0\xA4\xA8\xE0\xA4\xAE\xE0\xA4\xB8\xE0\xA5\x8D\xE0\xA4\xA4\xE0\xA5\x87",
    "emoji \xF0\x9F\xA4\x96\xF0\x9F\x91\x8D\xF0\x9F\x8F\xBD family \xF0\x9F\x91\xA8\xE2\x80\x8D\xF0\x9F\x91\xA9\xE2\x80\x8D\xF0\x9F\x91\xA7",
    std::string(300, ' ') + "x" + std::string(40, '\t') + std::string(7, '\n') + "  ",
    "0 1 12 123 1234 12345678901234567890 3.14159 -7e10",
    "I'm you're he'll they've she'd it's WE'RE DON'T y'all",
    "<|im_start|>user\nhi there<|im_end|>\n<|im_start|>assistant\n",
    "a<tool>b <tool> <|endoftext|><|endoftext|>x",
    "e\xCC\x81 caf\xC3\xA9 \xEF\xAC\x81 \xE2\x84\xAB",
    "\r\n\r\n\xC2\x85\xC2\xA0\xE2\x80\xA8\xE3\x80\x80" "end",
    "",
};

TEST(Tokenizer, HandDerivedIds) {
  BpeFixture f = gpt2_fixture();
  Tokenizer t = f.load();
  // "the" -> t + he; " thing" -> Ġt h ing (Ġt+h has no merge; i n -> in, in g -> ing).
  EXPECT_EQ(t.encode("the thing"), (Ids{'t', f.id("he"), f.id(bl(" t")), 'h', f.id("ing")}));
  EXPECT_EQ(t.encode(" the"), (Ids{f.id(bl(" the"))}));
  EXPECT_EQ(t.encode("it's"), (Ids{'i', 't', f.id("'s")}));
  // 4 spaces + x: the regex leaves "   " + " x"; Ġ Ġ merges leftmost first.
  EXPECT_EQ(t.encode("    x"), (Ids{f.id(bl("  ")), ' ', ' ', 'x'}));
  // 8 spaces + x: "       " -> ĠĠ ĠĠ ĠĠ Ġ -> ĠĠĠĠ ĠĠ Ġ.
  EXPECT_EQ(t.encode("        x"), (Ids{f.id(bl("    ")), f.id(bl("  ")), ' ', ' ', 'x'}));
  EXPECT_EQ(t.encode("12345"), (Ids{f.id("12"), '3', '4', '5'}));
  EXPECT_EQ(t.encode("hi<|im_end|>the"), (Ids{'h', 'i', 268, 't', f.id("he")}));
  EXPECT_EQ(t.encode("\xF0\x9F\xA4\x96"), (Ids{0xF0, 0x9F, 0xA4, 0x96}));
  EXPECT_EQ(t.encode("\n\n\n"), (Ids{f.id(bl("\n\n")), '\n'}));
  EXPECT_EQ(t.encode(""), Ids{});
}

TEST(Tokenizer, MergesInArrayFormGiveTheSameIds) {
  BpeFixture f = gpt2_fixture();
  BpeFixture g = f;
  g.array_merges = true;
  Tokenizer a = f.load(), b = g.load();
  for (const auto& s : kRoundTripTexts) EXPECT_EQ(a.encode(s), b.encode(s)) << s;
}

TEST(Tokenizer, RoundTrips) {
  for (bool llama_style : {false, true}) {
    BpeFixture f = gpt2_fixture();
    if (llama_style) {
      f.pre_tokenizer = {{"type", "Sequence"},
                         {"pretokenizers",
                          {{{"type", "Split"}, {"pattern", {{"Regex", kLlama3Pattern}}}, {"behavior", "Isolated"}, {"invert", false}},
                           test::byte_level_pre(false, false)}}};
      f.ignore_merges = true;
    }
    Tokenizer t = f.load();
    for (const auto& s : kRoundTripTexts) {
      Ids ids = t.encode(s);
      EXPECT_EQ(t.decode(ids), s) << s;
      for (int32_t id : ids) EXPECT_TRUE(id >= 0 && id < t.vocab_size());
    }
  }
}

TEST(Tokenizer, SpanFastPathMatchesStringPipeline) {
  // Tokenizer cuts byte-level text as spans and hands raw bytes to the model;
  // the same cut as strings through the pre-tokenizer and BpeModel::encode
  // (the general path) must give the same ids.
  for (int variant = 0; variant < 3; ++variant) {
    BpeFixture f = gpt2_fixture();
    f.added_tokens = Json::array();
    if (variant == 1) {
      f.pre_tokenizer = {{"type", "Sequence"},
                         {"pretokenizers",
                          {{{"type", "Split"}, {"pattern", {{"Regex", kLlama3Pattern}}}, {"behavior", "Isolated"}, {"invert", false}},
                           test::byte_level_pre(false, false)}}};
      f.ignore_merges = true;
    } else if (variant == 2) {
      f.pre_tokenizer = {{"type", "Sequence"},
                         {"pretokenizers",
                          {{{"type", "Digits"}, {"individual_digits", true}},
                           {{"type", "Split"}, {"pattern", {{"String", " "}}}, {"behavior", "MergedWithNext"}, {"invert", false}},
                           test::byte_level_pre(false, true)}}};
    }
    Tokenizer t = f.load();
    Json j = Json::parse(f.json());
    BpeModel model = BpeModel::from_json(j["model"], "model");
    auto pre = make_pre_tokenizer(j["pre_tokenizer"], "pre_tokenizer");
    for (const auto& s : kRoundTripTexts) {
      std::vector<std::string> pieces{s};
      if (s.empty()) pieces.clear();
      pre->apply(pieces);
      Ids want;
      for (const auto& p : pieces) model.encode(p, want);
      EXPECT_EQ(t.encode(s), want) << variant << " " << s;
    }
  }
}

TEST(Tokenizer, InvalidUtf8IsReplacedNeverCrashes) {
  Tokenizer t = gpt2_fixture().load();
  // "\xFF" becomes U+FFFD (EF BF BD), a symbol the regex isolates.
  EXPECT_EQ(t.encode("a\xFF" "b"), (Ids{'a', 0xEF, 0xBF, 0xBD, 'b'}));
  EXPECT_EQ(t.decode(t.encode("a\xFF" "b")), "a\xEF\xBF\xBD" "b");
  EXPECT_EQ(t.encode("ok\xE2\x82"), t.encode("ok\xEF\xBF\xBD"));
  std::mt19937 rng(3);
  for (int trial = 0; trial < 300; ++trial) {
    std::string s;
    for (int i = 0; i < 50; ++i) s.push_back(static_cast<char>(rng() & 0xFF));
    Ids ids = t.encode(s);
    std::string back = t.decode(ids);
    EXPECT_TRUE(utf8_is_valid(back));
    EXPECT_EQ(back, utf8_sanitize(s));
  }
}

TEST(Tokenizer, DecodeSkipsSpecialTokensOnlyWhenAsked) {
  Tokenizer t = gpt2_fixture().load();
  Ids ids = t.encode("<|im_start|>user<tool>x<|im_end|>");
  EXPECT_EQ(t.decode(ids), "<|im_start|>user<tool>x<|im_end|>");
  EXPECT_EQ(t.decode(ids, /*skip_special_tokens=*/true), "user<tool>x");  // <tool> is not special
  EXPECT_EQ(t.decode(Ids{'a', -5, 99999, 'b'}), "ab");                    // unknown ids are skipped
  EXPECT_TRUE(t.is_special(268));
  EXPECT_FALSE(t.is_special(269));
  EXPECT_EQ(t.token_to_id("<|im_end|>"), 268);
  EXPECT_EQ(t.id_to_token(256), bl(" t"));
  EXPECT_EQ(t.vocab_size(), 270);
}

TEST(Tokenizer, AddedTokenIdsFollowHuggingFace) {
  BpeFixture f;
  // "he" is in the vocab (a merge), so the added token takes its id; the others
  // get vocab_size, vocab_size+1, ... whatever id the file claims.
  f.merges = {{"h", "e"}};
  f.added_tokens = Json::array({test::added_token(500, "<a>"), test::added_token(7, "he", false),
                                test::added_token(3, "<b>"), test::added_token(500, "<a>")});
  Tokenizer t = f.load();
  EXPECT_EQ(t.token_to_id("<a>"), 257);
  EXPECT_EQ(t.token_to_id("he"), 256);
  EXPECT_EQ(t.token_to_id("<b>"), 258);
  EXPECT_EQ(t.vocab_size(), 259);
  EXPECT_EQ(t.encode("<b>he<a>"), (Ids{258, 256, 257}));
}

TEST(Tokenizer, AddedTokenMatchingRules) {
  BpeFixture f;
  f.normalizer = {{"type", "Lowercase"}};
  f.added_tokens = Json::array({
      test::added_token(256, "<mask>", false, false, /*lstrip=*/true, /*rstrip=*/true),
      test::added_token(257, "<w>", false, false, false, false, /*single_word=*/true),
      test::added_token(258, "hello", false, /*normalized=*/true),
      test::added_token(259, "<B>", true, /*normalized=*/false),
      test::added_token(260, "<a>", true),
      test::added_token(261, "<a><b>", true),
  });
  Tokenizer t = f.load();
  // lstrip/rstrip swallow the spaces around the token.
  EXPECT_EQ(t.encode("a <mask>  b"), (Ids{'a', 256, 'b'}));
  // single_word: inside a word it is plain text.
  EXPECT_EQ(t.encode("x<w> <w>"), (Ids{'x', '<', 'w', '>', ' ', 257}));
  // normalized tokens match the lowercased text; raw ones only the raw text.
  EXPECT_EQ(t.encode("HeLLo"), (Ids{258}));
  EXPECT_EQ(t.encode("<B>"), (Ids{259}));
  EXPECT_EQ(t.encode("<b>"), (Ids{'<', 'b', '>'}));
  // The longest token wins at a position.
  EXPECT_EQ(t.encode("<a><b><a>"), (Ids{261, 260}));
  EXPECT_EQ(t.decode(t.encode("x <mask> y")), "x<mask>y");
}

TEST(Tokenizer, NormalizerRunsBetweenAddedTokens) {
  BpeFixture f = gpt2_fixture();
  f.normalizer = {{"type", "NFC"}};
  Tokenizer t = f.load();
  // e + combining acute becomes U+00E9 (C3 A9) before the byte-level split.
  EXPECT_EQ(t.encode("e\xCC\x81<|im_end|>e\xCC\x81"), (Ids{0xC3, 0xA9, 268, 0xC3, 0xA9}));
  f.normalizer = {{"type", "Sequence"}, {"normalizers", Json::array()}};  // DeepSeek-V3: no-op
  EXPECT_EQ(f.load().encode("e\xCC\x81"), (Ids{'e', 0xCC, 0x81}));
}

TEST(Tokenizer, PostProcessorAddsSpecialTokens) {
  BpeFixture f = gpt2_fixture();
  f.post_processor = {
      {"type", "TemplateProcessing"},
      {"single", {{{"SpecialToken", {{"id", "<|im_start|>"}, {"type_id", 0}}}}, {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
      {"pair", Json::array()},
      {"special_tokens", {{"<|im_start|>", {{"id", "<|im_start|>"}, {"ids", {267}}, {"tokens", {"<|im_start|>"}}}}}}};
  Tokenizer t = f.load();
  EXPECT_EQ(t.encode("hi", true), (Ids{267, 'h', 'i'}));
  EXPECT_EQ(t.encode("hi", false), (Ids{'h', 'i'}));
  // A Llama-family tokenizer_config decides BOS/EOS itself (as transformers does).
  TokenizerConfig cfg;
  cfg.tokenizer_class = "LlamaTokenizerFast";
  cfg.bos_token = "<|endoftext|>";
  cfg.eos_token = "<|im_end|>";
  cfg.add_eos_token = true;
  Tokenizer l = Tokenizer::from_json_text(f.json(), "fixture", cfg);
  EXPECT_EQ(l.encode("hi", true), (Ids{266, 'h', 'i', 268}));
  EXPECT_EQ(l.bos_id(), 266);
  EXPECT_EQ(l.eos_id(), 268);
}

TEST(Tokenizer, ByteFallbackModelLikeLlama2) {
  // SentencePiece-style BPE: '▁' for spaces, <0xAB> tokens for unknown bytes.
  const std::string sp = "\xE2\x96\x81";
  Json vocab = Json::object();
  int next = 0;
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    vocab[name] = next++;
  }
  for (const std::string& tok : {sp, std::string("h"), std::string("i"), sp + "h", sp + "hi"}) vocab[tok] = next++;
  Json j = {{"version", "1.0"},
            {"added_tokens", Json::array()},
            {"normalizer",
             {{"type", "Sequence"},
              {"normalizers",
               {{{"type", "Prepend"}, {"prepend", sp}}, {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", sp}}}}}},
            {"pre_tokenizer", nullptr},
            {"post_processor", nullptr},
            {"decoder",
             {{"type", "Sequence"},
              {"decoders",
               {{{"type", "Replace"}, {"pattern", {{"String", sp}}}, {"content", " "}},
                {{"type", "ByteFallback"}},
                {{"type", "Fuse"}},
                {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}}}}},
            {"model",
             {{"type", "BPE"}, {"byte_fallback", true}, {"fuse_unk", true}, {"unk_token", nullptr}, {"vocab", vocab},
              {"merges", Json::array({sp + " h", sp + "h i"})}}}};
  Tokenizer t = Tokenizer::from_json_text(j.dump());
  Ids ids = t.encode("hi \xF0\x9F\xA4\x96");
  EXPECT_EQ(ids, (Ids{260, 256, 0xF0, 0x9F, 0xA4, 0x96}));
  EXPECT_EQ(t.decode(ids), "hi \xF0\x9F\xA4\x96");
  // A byte run that is not UTF-8 decodes to one U+FFFD per byte token (HF ByteFallback).
  // (the leading space of "▁" is then removed by Strip, as in HF).
  EXPECT_EQ(t.decode(Ids{256, 0xF0, 0x9F, 257}), "\xEF\xBF\xBD\xEF\xBF\xBDh");
  DecodeStream ds = t.decode_stream();
  std::string streamed;
  for (int32_t id : ids) streamed += ds.step(id);
  streamed += ds.flush();
  EXPECT_EQ(streamed, t.decode(ids));
}

TEST(Tokenizer, DecodeStreamNeverEmitsBrokenUtf8) {
  BpeFixture f = gpt2_fixture();
  Tokenizer t = f.load();
  // The emoji's four byte tokens: nothing comes out until the last one.
  DecodeStream ds = t.decode_stream();
  EXPECT_EQ(ds.step('a'), "a");
  EXPECT_EQ(ds.step(0xF0), "");
  EXPECT_EQ(ds.step(0x9F), "");
  EXPECT_EQ(ds.step(0xA4), "");
  EXPECT_EQ(ds.step(0x96), "\xF0\x9F\xA4\x96");
  EXPECT_EQ(ds.step(268), "<|im_end|>");
  EXPECT_EQ(ds.flush(), "");
  // Streams of random ids: every chunk is valid UTF-8 and the chunks add up to decode().
  std::mt19937 rng(11);
  for (bool skip : {false, true}) {
    for (int trial = 0; trial < 200; ++trial) {
      Ids ids;
      for (int i = 0; i < 30; ++i) ids.push_back(static_cast<int32_t>(rng() % static_cast<uint32_t>(t.vocab_size())));
      DecodeStream s = t.decode_stream(skip);
      std::string all;
      for (int32_t id : ids) {
        std::string chunk = s.step(id);
        ASSERT_TRUE(utf8_is_valid(chunk));
        all += chunk;
      }
      all += s.flush();
      ASSERT_EQ(all, t.decode(ids, skip));
    }
  }
  // A stream of a real encoding gives back the text.
  std::string text = kRoundTripTexts[3] + kRoundTripTexts[1];
  DecodeStream s = t.decode_stream();
  std::string all;
  for (int32_t id : t.encode(text)) all += s.step(id);
  EXPECT_EQ(all + s.flush(), text);
}

void expect_load_error(const Json& patch, const std::string& needle) {
  BpeFixture f = gpt2_fixture();
  Json j = Json::parse(f.json());
  j.merge_patch(patch);
  try {
    Tokenizer::from_json_text(j.dump(), "dir/tokenizer.json");
    ADD_FAILURE() << "expected an error mentioning " << needle;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(Tokenizer, UnsupportedPartsFailLoudlyNamingTheField) {
  expect_load_error({{"normalizer", {{"type", "BertNormalizer"}}}},
                    "dir/tokenizer.json: normalizer.type: normalizer 'BertNormalizer' is not supported");
  expect_load_error({{"pre_tokenizer", {{"type", "Metaspace"}}}}, "dir/tokenizer.json: pre_tokenizer.type");
  expect_load_error({{"decoder", {{"type", "WordPiece"}}}}, "dir/tokenizer.json: decoder.type: decoder 'WordPiece'");
  expect_load_error({{"post_processor", {{"type", "Mystery"}}}}, "dir/tokenizer.json: post_processor.type");
  expect_load_error({{"model", {{"type", "Unigram"}}}}, "dir/tokenizer.json: model.type: model type 'Unigram'");
  expect_load_error({{"version", "2.0"}}, "dir/tokenizer.json: version");
  try {
    Tokenizer::from_json_text("{not json", "dir/tokenizer.json");
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("dir/tokenizer.json: invalid JSON"), std::string::npos);
  }
}

TEST(Tokenizer, LoadsDirectoriesWithConfig) {
  test::TempDir dir;
  dir.write("tokenizer.json", gpt2_fixture().json());
  dir.write("tokenizer_config.json",
            R"({"bos_token": null, "eos_token": {"content": "<|im_end|>", "__type": "AddedToken"},
                "pad_token": "<|endoftext|>", "chat_template": "{% for m in messages %}<|im_start|>...{% endfor %}"})");
  Tokenizer t = Tokenizer::load(dir.path());
  EXPECT_EQ(t.eos_id(), 268);
  EXPECT_EQ(t.pad_id(), 266);
  EXPECT_EQ(t.bos_id(), std::nullopt);
  EXPECT_EQ(t.chat_template().name(), "chatml");
  EXPECT_EQ(t.encode_chat({{"user", "hi"}}),
            (Ids{267, 'u', 's', 'e', 'r', '\n', 'h', 'i', 268, '\n', 267, 'a', 's', 's', 'i', 's', 't', 'a', 'n', 't', '\n'}));
  Tokenizer same = Tokenizer::load(dir.path() / "tokenizer.json");
  EXPECT_EQ(same.eos_id(), 268);
  try {
    Tokenizer::load(dir.path() / "missing");
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("missing"), std::string::npos);
  }
}

TEST(Tokenizer, ConcurrentEncodesAgree) {
  Tokenizer t = gpt2_fixture().load();
  std::vector<Ids> want;
  for (const auto& s : kRoundTripTexts) want.push_back(t.encode(s));
  std::vector<std::thread> threads;
  std::atomic<int> bad{0};
  for (int k = 0; k < 4; ++k) {
    threads.emplace_back([&] {
      for (int rep = 0; rep < 20; ++rep)
        for (size_t i = 0; i < kRoundTripTexts.size(); ++i)
          if (t.encode(kRoundTripTexts[i]) != want[i]) ++bad;
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(bad.load(), 0);
}

// ---- inputs found by the fuzz target (tests/fuzz/targets/tokenizer.cpp) ----

// The Llama-2-like byte-fallback tokenizer of ByteFallbackModelLikeLlama2
// (ids 0..255 the byte tokens, 256 "▁", 257 "h", 258 "i", 259 "▁h", 260 "▁hi")
// plus <s> (261, special).
Tokenizer byte_fallback_tokenizer() {
  const std::string sp = "\xE2\x96\x81";
  Json vocab = Json::object();
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    vocab[name] = b;
  }
  int next = 256;
  for (const std::string& tok :
       {sp, std::string("h"), std::string("i"), sp + "h", sp + "hi", std::string("<s>")})
    vocab[tok] = next++;
  Json j = {{"version", "1.0"},
            {"added_tokens", Json::array({test::added_token(261, "<s>")})},
            {"normalizer",
             {{"type", "Sequence"},
              {"normalizers",
               {{{"type", "Prepend"}, {"prepend", sp}},
                {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", sp}}}}}},
            {"pre_tokenizer", nullptr},
            {"post_processor", nullptr},
            {"decoder",
             {{"type", "Sequence"},
              {"decoders",
               {{{"type", "Replace"}, {"pattern", {{"String", sp}}}, {"content", " "}},
                {{"type", "ByteFallback"}},
                {{"type", "Fuse"}},
                {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}}}}},
            {"model",
             {{"type", "BPE"},
              {"byte_fallback", true},
              {"fuse_unk", true},
              {"unk_token", nullptr},
              {"vocab", vocab},
              {"merges", Json::array({sp + " h", sp + "h i"})}}}};
  return Tokenizer::from_json_text(j.dump());
}

std::string streamed(const Tokenizer& t, const Ids& ids, bool skip) {
  DecodeStream s = t.decode_stream(skip);
  std::string all;
  for (int32_t id : ids) all += s.step(id);
  return all + s.flush();
}

// ByteFallback decodes a run of byte tokens as a whole: "中" (E4 B8 AD) is
// text until E6 starts the next character, when the run [E4 B8 AD E6] is
// four U+FFFD. The stream used to take that for a context that decodes
// differently, drop it, and emit "中" a second time ("中中文").
TEST(TokenizerFuzz, DecodeStreamHoldsAByteFallbackRunBack) {
  const Tokenizer t = byte_fallback_tokenizer();
  for (const Ids& ids :
       {Ids{0xE4, 0xB8, 0xAD, 0xE6, 0x96, 0x87}, Ids{256, 0xE4, 0xB8, 0xAD, 0xE6, 0x96, 0x87, 257},
        Ids{0xE4, 0xB8, 0xAD, 0xE6}, Ids{0xC3, 0xBF, 0xC3, 0xBE, 0xEF, 0xBF, 0xBD, 0xEF},
        Ids{0xE4, 0xB8, 0xAD, 261, 0xE6, 0x96, 0x87, 261, 257}})
    for (const bool skip : {false, true})
      EXPECT_EQ(streamed(t, ids, skip), t.decode(ids, skip)) << ids.size();
  EXPECT_EQ(t.decode(Ids{0xE4, 0xB8, 0xAD, 0xE6, 0x96, 0x87}), "\xE4\xB8\xAD\xE6\x96\x87");
  // Random mixes of byte tokens (mostly UTF-8 lead and continuation bytes),
  // pieces and <s>.
  std::mt19937 rng(5);
  const Ids pool = {0xE4, 0xB8, 0xAD, 0xE6, 0x96, 0x87, 0xF0, 0x9F, 0x98,
                    0x80, 0xC3, 0xBF, 0x41, 256,  257,  259,  261};
  for (const bool skip : {false, true}) {
    for (int trial = 0; trial < 500; ++trial) {
      Ids ids;
      for (int i = 0; i < 12; ++i) ids.push_back(pool[rng() % pool.size()]);
      ASSERT_EQ(streamed(t, ids, skip), t.decode(ids, skip)) << "trial " << trial;
    }
  }
}

// With skip_special_tokens, <s> decodes to nothing; it used to become the
// stream's whole context, and the Strip decoder then dropped the space of the
// next "▁" that decode() keeps.
TEST(TokenizerFuzz, DecodeStreamKeepsTheSpaceAfterASkippedSpecial) {
  const Tokenizer t = byte_fallback_tokenizer();
  const Ids ids = {257, 256, 261, 256, 256, 257};
  EXPECT_EQ(t.decode(ids, true), "h   h");
  EXPECT_EQ(streamed(t, ids, true), "h   h");
  EXPECT_EQ(streamed(t, ids, false), t.decode(ids, false));
}

// A post-processor's ids are numbers in the file; encode(add_special_tokens)
// handed out 99999999 for a 263-token vocabulary.
TEST(TokenizerFuzz, PostProcessorIdsMustBeTokens) {
  const Json tmpl = {{"type", "TemplateProcessing"},
                     {"single", Json::array({{{"SpecialToken", {{"id", "X"}, {"type_id", 0}}}},
                                             {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}})},
                     {"special_tokens", {{"X", {{"id", "X"}, {"ids", {99999999}}, {"tokens", {"X"}}}}}}};
  expect_load_error({{"post_processor", tmpl}}, "dir/tokenizer.json: post_processor: adds token id 99999999");
  expect_load_error(
      {{"post_processor", {{"type", "RobertaProcessing"}, {"cls", {"<s>", -1}}, {"sep", {"</s>", 2}}}}},
      "adds token id -1");
}

// A number past double's range is nlohmann's out_of_range, which escaped as
// a non-Error from both files.
TEST(TokenizerFuzz, NumberOverflowIsAnError) {
  try {
    Tokenizer::from_json_text(R"({"version": "1.0", "model": {"type": "BPE", "vocab": {"a": 1e400}}})",
                              "dir/tokenizer.json");
    ADD_FAILURE() << "expected an Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("dir/tokenizer.json: invalid JSON"), std::string::npos) << e.what();
  }
  test::TempDir dir;
  dir.write("tokenizer_config.json", R"({"model_max_length": 1e400})");
  try {
    TokenizerConfig::from_file(dir.path() / "tokenizer_config.json");
    ADD_FAILURE() << "expected an Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tokenizer_config.json: invalid JSON"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace lockstep::tokenizer
