// The byte format of rollout requests and results sent between ranks
// (rl/rollout_wire.h): every field survives the round trip bit for bit
// (NaN and -0.0 logprobs included), and a message that is truncated, padded,
// of the other kind, or carries a stop_checker is refused with a message.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "lockstep/base/error.h"
#include "lockstep/rl/mpi_rollout.h"
#include "lockstep/rl/rollout_wire.h"

namespace lockstep::rl {
namespace {

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

std::vector<rollout::Request> sample_requests() {
  std::vector<rollout::Request> rs(3);
  rs[0].prompt_ids = {1, 2, 3, 270};
  rs[0].params.temperature = 0.7f;
  rs[0].params.top_k = 5;
  rs[0].params.top_p = 0.9f;
  rs[0].params.min_p = 0.05f;
  rs[0].params.max_new_tokens = 17;
  rs[0].params.stop_token_ids = {268, 269};
  rs[0].params.stop = {"</answer>", ""};
  rs[0].params.ignore_eos = true;
  rs[0].params.n = 8;
  rs[0].params.seed = 123456789012345;
  rs[0].params.return_logprobs = false;
  rs[0].return_experts = true;
  rs[1].prompt_ids = {};  // empty fields travel too
  rs[2].prompt_ids = {42};
  rs[2].params.seed = -1;
  return rs;
}

void expect_same(const rollout::SamplingParams& a, const rollout::SamplingParams& b) {
  EXPECT_EQ(a.temperature, b.temperature);
  EXPECT_EQ(a.top_k, b.top_k);
  EXPECT_EQ(a.top_p, b.top_p);
  EXPECT_EQ(a.min_p, b.min_p);
  EXPECT_EQ(a.max_new_tokens, b.max_new_tokens);
  EXPECT_EQ(a.stop_token_ids, b.stop_token_ids);
  EXPECT_EQ(a.stop, b.stop);
  EXPECT_EQ(a.ignore_eos, b.ignore_eos);
  EXPECT_EQ(a.n, b.n);
  EXPECT_EQ(a.seed, b.seed);
  EXPECT_EQ(a.return_logprobs, b.return_logprobs);
}

TEST(RolloutWire, RequestsRoundTrip) {
  const auto rs = sample_requests();
  const auto back = decode_requests(encode_requests(rs));
  ASSERT_EQ(back.size(), rs.size());
  for (size_t i = 0; i < rs.size(); ++i) {
    EXPECT_EQ(back[i].prompt_ids, rs[i].prompt_ids) << i;
    EXPECT_EQ(back[i].return_experts, rs[i].return_experts) << i;
    expect_same(back[i].params, rs[i].params);
    EXPECT_FALSE(back[i].stop_checker);
  }
  EXPECT_TRUE(decode_requests(encode_requests({})).empty());
}

std::vector<rollout::RequestResult> sample_results() {
  std::vector<rollout::RequestResult> rs(2);
  rs[0].id = 77;
  rs[0].prompt_ids = {5, 6};
  rs[0].samples.resize(2);
  rs[0].samples[0].output_ids = {9, 10, 11};
  rs[0].samples[0].logprobs = {-0.0f, std::numeric_limits<float>::quiet_NaN(), -1e-30f};
  rs[0].samples[0].finish_reason = "length";
  rs[0].samples[0].routed_experts = {0, 3, 1, 2, 3, 0};
  rs[0].samples[0].weight_version = 12;
  rs[0].samples[0].weight_version_end = 13;
  rs[0].samples[0].ttft_s = 0.25;
  rs[0].samples[0].latency_s = 1.5;
  rs[0].samples[0].indexer_topk = {0, 2, -1, 1, 3, -1};  // DeepSeek-V4: last field of a sample
  rs[0].samples[1].finish_reason = "stop";
  rs[1].id = 78;  // a request with no samples
  return rs;
}

TEST(RolloutWire, ResultsRoundTripBitForBit) {
  const auto rs = sample_results();
  int64_t tokens = -1;
  const auto back = decode_results(encode_results(rs, 4242), &tokens);
  EXPECT_EQ(tokens, 4242);
  ASSERT_EQ(back.size(), rs.size());
  for (size_t i = 0; i < rs.size(); ++i) {
    EXPECT_EQ(back[i].id, rs[i].id);
    EXPECT_EQ(back[i].prompt_ids, rs[i].prompt_ids);
    ASSERT_EQ(back[i].samples.size(), rs[i].samples.size());
    for (size_t s = 0; s < rs[i].samples.size(); ++s) {
      const auto &a = rs[i].samples[s], &b = back[i].samples[s];
      EXPECT_EQ(a.output_ids, b.output_ids);
      ASSERT_EQ(a.logprobs.size(), b.logprobs.size());
      // No memcmp of no bytes: an empty vector's data() may be null.
      EXPECT_TRUE(a.logprobs.empty() ||
                  std::memcmp(a.logprobs.data(), b.logprobs.data(), a.logprobs.size() * sizeof(float)) == 0);
      EXPECT_EQ(a.finish_reason, b.finish_reason);
      EXPECT_EQ(a.routed_experts, b.routed_experts);
      EXPECT_EQ(a.weight_version, b.weight_version);
      EXPECT_EQ(a.weight_version_end, b.weight_version_end);
      EXPECT_EQ(a.ttft_s, b.ttft_s);
      EXPECT_EQ(a.latency_s, b.latency_s);
      EXPECT_EQ(a.indexer_topk, b.indexer_topk);
    }
  }
  EXPECT_TRUE(std::signbit(back[0].samples[0].logprobs[0]));
}

TEST(RolloutWire, BadMessagesAreRefused) {
  std::vector<char> req = encode_requests(sample_requests());
  std::vector<char> res = encode_results(sample_results(), 1);
  // Every proper prefix is truncated somewhere.
  for (size_t n = 0; n < req.size(); ++n) {
    std::vector<char> cut(req.begin(), req.begin() + ptrdiff_t(n));
    EXPECT_NE(error_of([&] { decode_requests(cut); }), "") << "prefix of " << n << " bytes";
  }
  for (size_t n = 0; n < res.size(); ++n) {
    std::vector<char> cut(res.begin(), res.begin() + ptrdiff_t(n));
    EXPECT_NE(error_of([&] { decode_results(cut, nullptr); }), "") << "prefix of " << n << " bytes";
  }
  std::vector<char> padded = req;
  padded.push_back(0);
  EXPECT_NE(error_of([&] { decode_requests(padded); }).find("left over"), std::string::npos);
  EXPECT_NE(error_of([&] { decode_requests(res); }).find("not a message of this kind"), std::string::npos);
  // A huge count is refused before anything is allocated.
  std::vector<char> huge = encode_requests({});
  const uint64_t big = uint64_t(1) << 62;
  std::memcpy(huge.data() + 8, &big, sizeof big);
  EXPECT_NE(error_of([&] { decode_requests(huge); }).find("runs past the end"), std::string::npos);
  // A count that fits the bytes left but not the elements' smallest size is
  // refused up front too: 1000 zero bytes claiming 1000 requests used to
  // allocate 1000 Requests (hundreds of bytes each) before running out.
  std::vector<char> many = encode_requests({});
  const uint64_t thousand = 1000;
  std::memcpy(many.data() + 8, &thousand, sizeof thousand);
  many.resize(many.size() + 1000, 0);
  EXPECT_NE(error_of([&] { decode_requests(many); }).find("a count of 1000 at byte 16 runs past the end"),
            std::string::npos)
      << error_of([&] { decode_requests(many); });
  std::vector<char> results = encode_results({}, 0);
  std::memcpy(results.data() + 16, &thousand, sizeof thousand);
  results.resize(results.size() + 1000, 0);
  EXPECT_NE(error_of([&] { decode_results(results, nullptr); }).find("a count of 1000"), std::string::npos);
  auto rs = sample_requests();
  rs[1].stop_checker = [](const std::vector<int32_t>&) { return int64_t(-1); };
  EXPECT_NE(error_of([&] { encode_requests(rs); }).find("stop_checker"), std::string::npos);
}

TEST(RolloutWire, MissingSeedsAreFilledDeterministically) {
  auto a = sample_requests(), b = sample_requests();
  fill_missing_seeds(a, 9, 4);
  fill_missing_seeds(b, 9, 4);
  EXPECT_EQ(a[0].params.seed, 123456789012345);  // a given seed stays
  EXPECT_GE(a[1].params.seed, 0);
  EXPECT_GE(a[2].params.seed, 0);
  EXPECT_NE(a[1].params.seed, a[2].params.seed);
  EXPECT_EQ(a[2].params.seed, b[2].params.seed);
  auto c = sample_requests();
  fill_missing_seeds(c, 9, 5);  // another call, other seeds
  EXPECT_NE(c[2].params.seed, a[2].params.seed);
}

}  // namespace
}  // namespace lockstep::rl
