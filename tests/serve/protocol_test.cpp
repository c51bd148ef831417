// serve/protocol linked directly (no server, no sockets): request parsing of
// the three APIs with token-id prompts, the 400 errors that name the field,
// context checks, stop-string search and hold-back, per-sample ids.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "lockstep/serve/protocol.h"

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
  EXPECT_NE(std::string(parse_error(json{{"input_ids", {1, 99}}}).what()).find("input_ids[1]"), std::string::npos);
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

}  // namespace
}  // namespace lockstep::serve
