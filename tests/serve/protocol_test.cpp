// serve/protocol linked directly (no server, no sockets): request parsing of
// the three APIs with token-id prompts, the 400 errors that name the field,
// context checks, stop-string search and hold-back, per-sample ids.
#include "lockstep/serve/protocol.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "lockstep/tokenizer/byte_level.h"
#include "lockstep/tokenizer/tokenizer.h"

namespace lockstep::serve {
namespace {

using nlohmann::json;

const ModelLimits kLimits{/*vocab_size=*/50, /*context=*/32, "tiny"};

// The HttpError a parse throws, or a test failure when it throws none.
HttpError parse_error(const json& body, GenJob (*parse)(const json&, const tokenizer::Tokenizer*,
                                                        const ModelLimits&) = parse_generate) {
  try {
    parse(body, nullptr, kLimits);
  } catch (const HttpError& e) {
    return e;
  }
  ADD_FAILURE() << "no HttpError for " << body.dump();
  return HttpError(0, "");
}

// The body reader (moved from server.cpp so that the fuzz target runs it):
// every way a body can be bad is a 400.
TEST(ServeProtocol, BodiesThatAreNotJsonAre400) {
  for (const std::string& body :
       {std::string(""), std::string("{\"text\": \"a\""), std::string("{\"n\": 1e400}"),
        std::string("[-1e999]"), std::string("{\"a\": 1}\0{", 10),
        std::string(100, '[') + std::string(100, ']')}) {
    try {
      parse_json_body(body);
      ADD_FAILURE() << "no HttpError for " << body;
    } catch (const HttpError& e) {
      EXPECT_EQ(e.status(), 400) << body;
    }
  }
  EXPECT_EQ(parse_json_body("{\"text\": \"[[[\"}")["text"], "[[[");  // brackets in strings do not nest
  // Found by tests/fuzz/targets/serve_protocol.cpp: nlohmann quotes the last
  // token read, whitespace before it included, 8 bytes per control byte
  // ("<U+0009>"), so 2000 tabs before a bad literal made a 16 KB message.
  try {
    parse_json_body(std::string(2000, '\t') + "u\"t,\":-4");
    ADD_FAILURE();
  } catch (const HttpError& e) {
    EXPECT_EQ(e.status(), 400);
    EXPECT_LT(std::string(e.what()).size(), 400u) << e.what();
    EXPECT_NE(std::string(e.what()).find("invalid JSON: [json.exception.parse_error.101]"),
              std::string::npos);
  }
}

TEST(ServeProtocol, GenerateWithTokenIds) {
  const json body = {{"input_ids", {1, 2, 3}},
                     {"sampling_params", {{"max_new_tokens", 5}, {"temperature", 0.5}, {"n", 3}}},
                     {"return_logprob", true},
                     {"rid", "abc"}};
  const GenJob job = parse_generate(body, nullptr, kLimits);
  EXPECT_EQ(job.api, Api::Generate);
  ASSERT_EQ(job.prompts.size(), 1u);
  EXPECT_EQ(job.prompts[0], (std::vector<int32_t>{1, 2, 3}));
  EXPECT_FALSE(job.batched);
  EXPECT_EQ(job.params.max_new_tokens, 5);
  EXPECT_FLOAT_EQ(job.params.temperature, 0.5f);
  EXPECT_EQ(job.params.n, 3);
  EXPECT_TRUE(job.return_logprob);
  EXPECT_EQ(job.rid, "abc");
}

TEST(ServeProtocol, BatchedIdsAndDefaultShortenedToContext) {
  // A default max_new_tokens (SGLang: 128) is cut to what fits in the context.
  const GenJob job = parse_generate(json{{"input_ids", {{1, 2}, {3, 4, 5, 6}}}}, nullptr, kLimits);
  EXPECT_TRUE(job.batched);
  ASSERT_EQ(job.prompts.size(), 2u);
  EXPECT_EQ(job.params.max_new_tokens, 32 - 4);
}

TEST(ServeProtocol, ErrorsNameTheField) {
  EXPECT_NE(std::string(parse_error(json{{"input_ids", {1, 99}}}).what()).find("input_ids[1]"),
            std::string::npos);
  EXPECT_NE(std::string(parse_error(json{{"input_ids", {1}}, {"bogus", 1}}).what()).find("bogus"),
            std::string::npos);
  EXPECT_NE(std::string(parse_error(json{{"input_ids", {1}}, {"sampling_params", {{"n", "x"}}}}).what())
                .find("sampling_params.n"),
            std::string::npos);
  EXPECT_NE(std::string(parse_error(json{{"sampling_params", json::object()}}).what()).find("input_ids"),
            std::string::npos);
  // Text prompts need a tokenizer; without one the error says to send ids.
  EXPECT_NE(std::string(parse_error(json{{"text", "hi"}}).what()).find("tokenizer"), std::string::npos);
  EXPECT_EQ(parse_error(json{{"input_ids", {1}}, {"bogus", 1}}).status(), 400);
}

// Found by 30 CPU-minutes of fuzzing (tests/fuzz/targets/serve_protocol.cpp):
// an unknown key was quoted whole, so a key of kilobytes made a message of
// kilobytes. Keys are quoted as excerpts, also nested ones.
TEST(ServeProtocol, UnknownKeysAreQuotedAsExcerpts) {
  const std::string key = "t|&al" + std::string(5000, '{');
  for (const json& body :
       {json{{"input_ids", {1}}, {key, 1}}, json{{"input_ids", {1}}, {"sampling_params", {{key, 1}}}}}) {
    const std::string what = parse_error(body).what();
    EXPECT_LT(what.size(), 600u) << what.substr(0, 300);
    EXPECT_NE(what.find("unknown parameter"), std::string::npos) << what.substr(0, 300);
    EXPECT_NE(what.find("t|&al{{{"), std::string::npos) << what.substr(0, 300);
    EXPECT_NE(what.find("(5005 bytes)"), std::string::npos) << what.substr(0, 300);
  }
}

// Messages the soak test (tests/serve/soak.py) found naming another field
// than the one the client sent.
TEST(ServeProtocol, RangeErrorsNameTheKeyTheClientSent) {
  auto message = [](const json& body, auto parse) { return std::string(parse_error(body, parse).what()); };
  const std::string seed =
      message(json{{"input_ids", {1}}, {"sampling_params", {{"sampling_seed", -7}}}}, parse_generate);
  EXPECT_NE(seed.find("sampling_params.sampling_seed"), std::string::npos) << seed;
  const std::string max_tokens = message(json{{"prompt", {1, 2}}, {"max_tokens", -7}}, parse_completions);
  EXPECT_NE(max_tokens.find("max_tokens must be >= 1"), std::string::npos) << max_tokens;
  EXPECT_EQ(max_tokens.find("max_new_tokens"), std::string::npos) << max_tokens;
  const std::string min_tokens = message(json{{"prompt", {1, 2}}, {"min_tokens", -1}}, parse_completions);
  EXPECT_NE(min_tokens.find("min_tokens"), std::string::npos) << min_tokens;
  EXPECT_EQ(min_tokens.find("min_new_tokens"), std::string::npos) << min_tokens;
}

// A number past float's range became inf before the range check, which then
// reported "got inf": the message quotes the value the client sent.
TEST(ServeProtocol, NumbersPastFloatRangeAreQuotedAsSent) {
  auto message = [](const json& body, auto parse) { return std::string(parse_error(body, parse).what()); };
  const std::string sglang =
      message(json{{"input_ids", {1}}, {"sampling_params", {{"temperature", 1e39}}}}, parse_generate);
  EXPECT_NE(sglang.find("sampling_params.temperature"), std::string::npos) << sglang;
  EXPECT_NE(sglang.find("got 1e+39"), std::string::npos) << sglang;
  EXPECT_EQ(sglang.find("inf"), std::string::npos) << sglang;
  const std::string openai = message(json{{"prompt", {1, 2}}, {"top_p", -5e38}}, parse_completions);
  EXPECT_NE(openai.find("top_p"), std::string::npos) << openai;
  EXPECT_NE(openai.find("got -5e+38"), std::string::npos) << openai;
  // Within float's range the usual range check answers, with the value.
  const std::string in_range =
      message(json{{"input_ids", {1}}, {"sampling_params", {{"temperature", -2.5}}}}, parse_generate);
  EXPECT_NE(in_range.find("got -2.5"), std::string::npos) << in_range;
}

// 4096 prompts x n = 1024 was accepted: four million samples in one
// request, gigabytes of engine state and answer (found by the soak test).
TEST(ServeProtocol, SamplesPerRequestAreCapped) {
  ModelLimits lim = kLimits;
  lim.max_samples = 8;
  const json ok = {{"input_ids", {{1}, {2}}}, {"sampling_params", {{"n", 4}, {"max_new_tokens", 1}}}};
  EXPECT_EQ(parse_generate(ok, nullptr, lim).params.n, 4);
  try {
    parse_generate(json{{"input_ids", {{1}, {2}, {3}}}, {"sampling_params", {{"n", 3}}}}, nullptr, lim);
    ADD_FAILURE() << "9 samples passed a cap of 8";
  } catch (const HttpError& e) {
    EXPECT_EQ(e.status(), 400);
    EXPECT_NE(std::string(e.what()).find("sampling_params.n"), std::string::npos) << e.what();
  }
  try {
    parse_completions(json{{"prompt", {{1}, {2}, {3}}}, {"n", 3}}, nullptr, lim);
    ADD_FAILURE() << "9 samples passed a cap of 8";
  } catch (const HttpError& e) {
    EXPECT_NE(std::string(e.what()).find("x n 3 = 9 samples"), std::string::npos) << e.what();
  }
}

TEST(ServeProtocol, ExplicitMaxTokensThatDoNotFitAreRejected) {
  const json body = {{"prompt", {1, 2, 3}}, {"max_tokens", 40}, {"model", "tiny"}};
  const HttpError e = parse_error(body, parse_completions);
  EXPECT_EQ(e.status(), 400);
  EXPECT_NE(std::string(e.what()).find("context of 32"), std::string::npos) << e.what();
  const json fits = {{"prompt", {1, 2, 3}}, {"max_tokens", 7}, {"model", "tiny"}};
  const GenJob job = parse_completions(fits, nullptr, kLimits);
  EXPECT_EQ(job.api, Api::Completions);
  EXPECT_EQ(job.params.max_new_tokens, 7);
  EXPECT_EQ(job.model, "tiny");
}

TEST(ServeProtocol, RoutingAndIndexerRecordsAreReturnedWhenAsked) {
  rollout::RequestResult r;
  r.prompt_ids = {1, 2};
  r.samples.resize(1);
  r.samples[0].output_ids = {3};
  r.samples[0].routed_experts = {0, 1, 1, 2, 2, 3};
  r.samples[0].indexer_topk = {-1, -1, 0, -1, 0, -1};
  const SampleOutput out;
  const GenJob plain = parse_generate(json{{"input_ids", {1, 2}}}, nullptr, kLimits);
  EXPECT_FALSE(plain.return_experts);
  EXPECT_FALSE(plain.return_indexer);
  const json m0 = generate_item(plain, r, 0, out, nullptr, "x")["meta_info"];
  EXPECT_FALSE(m0.contains("routed_experts"));
  EXPECT_FALSE(m0.contains("indexer_topk"));
  const GenJob both = parse_generate(
      json{{"input_ids", {1, 2}}, {"return_routed_experts", true}, {"return_indexer_topk", true}}, nullptr,
      kLimits);
  EXPECT_TRUE(both.return_experts);
  EXPECT_TRUE(both.return_indexer);
  const json m1 = generate_item(both, r, 0, out, nullptr, "x")["meta_info"];
  EXPECT_EQ(m1["routed_experts"], json(r.samples[0].routed_experts));
  EXPECT_EQ(m1["indexer_topk"], json(r.samples[0].indexer_topk));
  EXPECT_NE(std::string(parse_error(json{{"input_ids", {1}}, {"return_indexer_topk", 3}}).what())
                .find("return_indexer_topk"),
            std::string::npos);
}

TEST(ServeProtocol, StopStrings) {
  std::string matched;
  EXPECT_EQ(find_stop("abc</s>def", {"def", "</s>"}, &matched), 3u);
  EXPECT_EQ(matched, "</s>");
  EXPECT_EQ(find_stop("abc", {"x"}), std::string::npos);
  // "ab<" may still become "<stop>": three characters are held back.
  EXPECT_EQ(stop_holdback("xyab<", {"<stop>", "ab<st"}), 3u);
  EXPECT_EQ(stop_holdback("xyz", {"<stop>"}), 0u);
}

TEST(ServeProtocol, SampleIdsAndErrorBody) {
  GenJob job;
  job.prompts = {{1}, {2}};
  job.params.n = 2;
  EXPECT_EQ(sample_id(job, "base", 3), "base-3");
  GenJob single;
  single.prompts = {{1}};
  EXPECT_EQ(sample_id(single, "base", 0), "base");
  const json e = error_body(400, "bad thing", "invalid_request_error");
  EXPECT_EQ(e["error"]["message"], "bad thing");
  EXPECT_EQ(e["error"]["type"], "invalid_request_error");
  EXPECT_EQ(e["error"]["code"], 400);
}

// The message of the 400 a parse throws.
std::string error_of(const json& body, GenJob (*parse)(const json&, const tokenizer::Tokenizer*,
                                                       const ModelLimits&) = parse_generate) {
  return parse_error(body, parse).what();
}

const json kChat = json::array({{{"role", "user"}, {"content", "hi"}}});

TEST(ServeProtocol, TopLogprobsAndPenaltiesAreParsedFromEveryApi) {
  const GenJob c = parse_completions(json{{"prompt", {1, 2}},
                                          {"logprobs", 5},
                                          {"echo", true},
                                          {"frequency_penalty", 0.5},
                                          {"presence_penalty", -1.0},
                                          {"repetition_penalty", 1.2},
                                          {"min_tokens", 3},
                                          {"logit_bias", {{"7", 100}, {"0", -2.5}}}},
                                     nullptr, kLimits);
  EXPECT_TRUE(c.return_logprob);
  EXPECT_EQ(c.params.top_logprobs, 5);
  EXPECT_TRUE(c.echo);
  EXPECT_EQ(c.logprob_start, 0);  // echo with logprobs: the prompt's logprobs too
  EXPECT_FLOAT_EQ(c.params.frequency_penalty, 0.5f);
  EXPECT_FLOAT_EQ(c.params.presence_penalty, -1.0f);
  EXPECT_FLOAT_EQ(c.params.repetition_penalty, 1.2f);
  EXPECT_EQ(c.params.min_new_tokens, 3);
  EXPECT_EQ(c.params.logit_bias, (std::vector<std::pair<int32_t, float>>{{0, -2.5f}, {7, 100.0f}}));
  const GenJob zero = parse_completions(json{{"prompt", {1, 2}}, {"logprobs", 0}}, nullptr, kLimits);
  EXPECT_TRUE(zero.return_logprob);
  EXPECT_EQ(zero.params.top_logprobs, 0);
  EXPECT_EQ(zero.logprob_start, -1);

  const GenJob g =
      parse_generate(json{{"input_ids", {1, 2, 3}},
                          {"return_logprob", true},
                          {"top_logprobs_num", 4},
                          {"logprob_start_len", 1},
                          {"sampling_params", {{"min_new_tokens", 2}, {"repetition_penalty", 0.9}}}},
                     nullptr, kLimits);
  EXPECT_EQ(g.params.top_logprobs, 4);
  EXPECT_EQ(g.logprob_start, 1);
  EXPECT_EQ(g.params.min_new_tokens, 2);
  EXPECT_FLOAT_EQ(g.params.repetition_penalty, 0.9f);
}

TEST(ServeProtocol, TopLogprobsAndPenaltyErrorsNameTheField) {
  const json p = {1, 2};
  EXPECT_NE(
      error_of(json{{"prompt", p}, {"logprobs", 21}}, parse_completions).find("logprobs must be in [0, 20]"),
      std::string::npos);
  EXPECT_NE(error_of(json{{"prompt", p}, {"logprobs", -1}}, parse_completions).find("logprobs"),
            std::string::npos);
  EXPECT_NE(error_of(json{{"prompt", p}, {"logprobs", true}}, parse_completions).find("logprobs"),
            std::string::npos);
  EXPECT_NE(error_of(json{{"prompt", p}, {"frequency_penalty", 2.5}}, parse_completions)
                .find("frequency_penalty must be in [-2, 2]"),
            std::string::npos);
  // OpenAI's fields sit at the top level: the message names them so.
  EXPECT_EQ(
      error_of(json{{"prompt", p}, {"presence_penalty", -3}}, parse_completions).find("sampling_params."),
      std::string::npos);
  EXPECT_NE(
      error_of(json{{"prompt", p}, {"repetition_penalty", 0}}, parse_completions).find("repetition_penalty"),
      std::string::npos);
  EXPECT_NE(error_of(json{{"prompt", p}, {"min_tokens", -1}}, parse_completions).find("min_tokens"),
            std::string::npos);
  EXPECT_NE(error_of(json{{"prompt", p}, {"logit_bias", {{"abc", 1}}}}, parse_completions).find("\"abc\""),
            std::string::npos);
  EXPECT_NE(
      error_of(json{{"prompt", p}, {"logit_bias", {{"-3", 1}}}}, parse_completions).find("not a token id"),
      std::string::npos);
  EXPECT_NE(
      error_of(json{{"prompt", p}, {"logit_bias", {{"50", 1}}}}, parse_completions).find("out of range"),
      std::string::npos);
  EXPECT_NE(error_of(json{{"prompt", p}, {"logit_bias", {{"5", 101}}}}, parse_completions)
                .find("logit_bias[\"5\"] must be in [-100, 100]"),
            std::string::npos);
  EXPECT_NE(error_of(json{{"prompt", p}, {"logit_bias", {{"5", "x"}}}}, parse_completions)
                .find("logit_bias[\"5\"]"),
            std::string::npos);
  EXPECT_NE(
      error_of(json{{"prompt", p}, {"logit_bias", {1, 2}}}, parse_completions).find("logit_bias must be"),
      std::string::npos);
  EXPECT_NE(
      error_of(json{{"prompt", p}, {"echo", true}, {"logprobs", 1}, {"stream", true}}, parse_completions)
          .find("echo"),
      std::string::npos);

  EXPECT_NE(error_of(json{{"messages", kChat}, {"top_logprobs", 3}}, parse_chat)
                .find("top_logprobs needs logprobs"),
            std::string::npos);
  EXPECT_NE(error_of(json{{"messages", kChat}, {"logprobs", true}, {"top_logprobs", 21}}, parse_chat)
                .find("top_logprobs must be in [0, 20]"),
            std::string::npos);

  const json ids = {1, 2, 3};
  EXPECT_NE(error_of(json{{"input_ids", ids}, {"top_logprobs_num", 2}})
                .find("top_logprobs_num needs return_logprob"),
            std::string::npos);
  EXPECT_NE(error_of(json{{"input_ids", ids}, {"return_logprob", true}, {"top_logprobs_num", 21}})
                .find("top_logprobs_num must be in [0, 20]"),
            std::string::npos);
  EXPECT_NE(error_of(json{{"input_ids", ids}, {"logprob_start_len", 0}}).find("logprob_start_len needs"),
            std::string::npos);
  EXPECT_NE(error_of(json{{"input_ids", ids}, {"return_logprob", true}, {"logprob_start_len", 3}})
                .find("logprob_start_len (3) must be less than the length of prompt 0"),
            std::string::npos);
  EXPECT_NE(error_of(json{{"input_ids", ids}, {"sampling_params", {{"presence_penalty", 9}}}})
                .find("sampling_params.presence_penalty"),
            std::string::npos);
  EXPECT_NE(error_of(json{{"input_ids", ids}, {"sampling_params", {{"min_new_tokens", -2}}}})
                .find("sampling_params.min_new_tokens"),
            std::string::npos);
  EXPECT_NE(error_of(json{{"input_ids", ids}, {"sampling_params", {{"logit_bias", {{"x1", 1}}}}}})
                .find("sampling_params.logit_bias"),
            std::string::npos);
}

// The answer shapes: SGLang's [logprob, id, text] lists, OpenAI's dicts and
// lists, null for the prompt's first token.
TEST(ServeProtocol, TopLogprobsAnswerShapes) {
  rollout::RequestResult r;
  r.prompt_ids = {1, 2};
  r.prompt_logprob_start = 0;
  r.prompt_logprobs = {std::nanf(""), -0.5f};
  r.prompt_top_logprobs = {{}, {{2, -0.5f}, {4, -1.5f}}};
  r.samples.resize(1);
  r.samples[0].output_ids = {3};
  r.samples[0].logprobs = {-0.25f};
  r.samples[0].top_logprobs = {{{3, -0.25f}, {9, -2.0f}}};
  const SampleOutput out;
  const GenJob g = parse_generate(
      json{
          {"input_ids", {1, 2}}, {"return_logprob", true}, {"top_logprobs_num", 2}, {"logprob_start_len", 0}},
      nullptr, kLimits);
  const json m = generate_item(g, r, 0, out, nullptr, "x")["meta_info"];
  EXPECT_EQ(m["output_top_logprobs"], json::parse("[[[-0.25, 3, null], [-2.0, 9, null]]]"));
  EXPECT_EQ(m["input_token_logprobs"], json::parse("[[null, 1, null], [-0.5, 2, null]]"));
  EXPECT_EQ(m["input_top_logprobs"], json::parse("[null, [[-0.5, 2, null], [-1.5, 4, null]]]"));

  const json chat =
      chat_logprobs(nullptr, r.samples[0].output_ids, r.samples[0].logprobs, &r.samples[0].top_logprobs);
  ASSERT_EQ(chat["content"][0]["top_logprobs"].size(), 2u);
  EXPECT_EQ(chat["content"][0]["top_logprobs"][1]["logprob"], -2.0);
  EXPECT_TRUE(chat["content"][0]["top_logprobs"][1]["bytes"].is_array());
  const json plain = chat_logprobs(nullptr, r.samples[0].output_ids, r.samples[0].logprobs);
  EXPECT_EQ(plain["content"][0]["top_logprobs"], json::array());
}

// OpenAI's top_logprobs is keyed by token: every key distinct. A token holding
// part of a character is "bytes:\\xNN" (not U+FFFD, which all such tokens
// decode to), a second token of the same text (an added token " " beside the
// byte " ") is "token_id:N", and tokens[i] is the sampled token's key.
TEST(ServeProtocol, TopLogprobsKeysAreDistinct) {
  const auto dir = std::filesystem::temp_directory_path() / ("lockstep-keys-" + std::to_string(::getpid()));
  tokenizer::write_byte_level_tokenizer(dir, {"<|endoftext|>", " "});
  const tokenizer::Tokenizer tok = tokenizer::Tokenizer::load(dir);
  std::filesystem::remove_all(dir);
  ASSERT_EQ(token_text(&tok, 257), " ");
  const std::vector<rollout::TopLogprobs> top = {
      {{32, -0.5f}, {257, -1.0f}, {0xE2, -2.0f}, {0x80, -3.0f}, {66, -4.0f}}};
  const json lp = completions_logprobs(&tok, {257}, {-1.0f}, 0, &top);
  const json& d = lp["top_logprobs"][0];
  ASSERT_EQ(d.size(), 5u) << d.dump();
  EXPECT_EQ(d[" "].get<float>(), -0.5f);
  EXPECT_EQ(d["token_id:257"].get<float>(), -1.0f);
  EXPECT_EQ(d["bytes:\\xe2"].get<float>(), -2.0f);
  EXPECT_EQ(d["bytes:\\x80"].get<float>(), -3.0f);
  EXPECT_EQ(d["B"].get<float>(), -4.0f);
  EXPECT_EQ(lp["tokens"][0], "token_id:257");
  EXPECT_EQ(lp["text_offset"][0], 0);
  // The sampled token outside the five: a sixth entry, under its own key.
  const std::vector<rollout::TopLogprobs> two = {top[0], top[0]};
  const json six = completions_logprobs(&tok, {0xE2, 67}, {-2.0f, -5.0f}, 0, &two);
  EXPECT_EQ(six["tokens"][0], "bytes:\\xe2");
  EXPECT_EQ(six["top_logprobs"][1].size(), 6u);
  EXPECT_EQ(six["top_logprobs"][1]["C"].get<float>(), -5.0f);
  // vLLM's return_tokens_as_token_ids.
  const json ids = completions_logprobs(&tok, {257}, {-1.0f}, 0, &top, true);
  EXPECT_EQ(ids["tokens"][0], "token_id:257");
  EXPECT_EQ(ids["top_logprobs"][0]["token_id:32"].get<float>(), -0.5f);
  EXPECT_EQ(ids["top_logprobs"][0].size(), 5u);
  // Chat: a part of a character keeps its own bytes.
  const json chat = chat_logprobs(&tok, {0xE2}, {-2.0f}, &top);
  EXPECT_EQ(chat["content"][0]["token"], "bytes:\\xe2");
  EXPECT_EQ(chat["content"][0]["bytes"], json::array({0xE2}));
  EXPECT_EQ(chat["content"][0]["top_logprobs"][3]["bytes"], json::array({0x80}));
  EXPECT_EQ(chat_logprobs(&tok, {66}, {-4.0f}, nullptr, true)["content"][0]["token"], "token_id:66");
}

}  // namespace
}  // namespace lockstep::serve
