// The parity suite across devices: the rollout engine on the GPU kernels in
// interpret mode, the trainer on the CPU kernels; every sampled token's
// logprob must be bitwise equal, under every scheduler variation (batch 1 to
// all at once, chunked prefill, prefix sharing, preemption, 1 or 2 threads).
#include <gtest/gtest.h>

#include <cstdlib>

#include "lockstep/kernels/gpu/backend.h"
#include "parity/parity_util.h"

namespace lockstep::parity {
namespace {

int64_t env_int(const char* name, int64_t fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::strtoll(v, nullptr, 10) : fallback;
}

// The kernels the rollout engine's forward reaches on dense and MoE models.
TEST(GpuParity, InterpretBackendCoversTheRolloutForward) {
  const kernels::GpuBackend& b = kernels::interpret_backend();
  std::string missing;
  for (const auto& m : b.missing()) missing += " " + m;
  missing += " ";
  for (const char* need :
       {"gemm_xwt_packed", "embedding_forward", "rmsnorm_forward", "add_rmsnorm_forward", "rope_forward",
        "swiglu_forward", "token_logprob_forward", "kv_cache_write", "attention_forward", "moe_route",
        "moe_gather", "moe_combine", "sample_rows", "add_row_bias", "add_rows", "add_scaled_rows",
        "sigmoid_forward", "fp8_quantize_rows"})
    EXPECT_EQ(missing.find(std::string(" ") + need + " "), std::string::npos)
        << need << " is not covered; missing:" << missing;
}

TEST(GpuParity, RolloutOnInterpretedGpuKernelsGivesTheCpuTrainersLogprobsBitForBit) {
  const int64_t n_cases = env_int("LOCKSTEP_GPU_PARITY_CASES", 6);
  const uint64_t seed0 = uint64_t(env_int("LOCKSTEP_PARITY_SEED", 2000));
  ThreadPool pool2(2);
  std::mt19937_64 g(seed0);
  CaseShape shape;
  shape.max_prompts = 6;
  shape.max_prompt_len = 24;
  shape.max_new_tokens = 8;
  shape.max_n = 3;
  int64_t tokens = 0, runs = 0, max_batch = 0;
  for (int64_t i = 0; i < n_cases; ++i) {
    const Case cs = random_case(seed0 + uint64_t(i), shape);
    const CaseStats st = check_case(cs, &pool2, g, DType::F32, &kernels::interpret_backend());
    tokens += st.tokens;
    runs += st.runs;
    max_batch = std::max(max_batch, st.max_batch);
    if (HasFailure()) break;
  }
  std::printf("[gpu parity] %lld cases, %lld engine runs matched, %lld tokens, largest batch %lld\n",
              (long long)n_cases, (long long)runs, (long long)tokens, (long long)max_batch);
  EXPECT_GT(tokens, 50);
}

// 16 prompts x 4 samples: the baseline variation decodes all 64 sequences in one
// batch; the batch-1 variation one at a time. Both must give the CPU trainer's bits.
TEST(GpuParity, BatchOf64OnInterpretedGpuKernelsMatchesTheTrainer) {
  ThreadPool pool2(2);
  std::mt19937_64 g(64);
  Case cs = random_case(6400);
  cs.requests.clear();
  cs.max_len = 0;
  for (int i = 0; i < 16; ++i) {
    Request r;
    for (int j = 0; j < 3 + i % 5; ++j) r.prompt_ids.push_back(int32_t(g() % uint64_t(cs.config.vocab_size)));
    r.params.n = 4;
    r.params.max_new_tokens = 4;
    r.params.ignore_eos = true;
    r.params.seed = uint64_t(i);
    cs.max_len = std::max<int64_t>(cs.max_len, int64_t(r.prompt_ids.size()) + 4);
    cs.requests.push_back(std::move(r));
  }
  const CaseStats st = check_case(cs, &pool2, g, DType::F32, &kernels::interpret_backend());
  EXPECT_EQ(st.tokens, 16 * 4 * 4);
  EXPECT_EQ(st.max_batch, 64);
}

TEST(GpuParity, AlignedAtBf16AndFp8OnInterpretedGpuKernels) {
  ThreadPool pool2(2);
  std::mt19937_64 g(77);
  CaseShape shape;
  shape.max_prompts = 4;
  shape.max_prompt_len = 16;
  shape.max_new_tokens = 6;
  for (DType p : {DType::BF16, DType::FP8E4M3}) {
    const Case cs = random_case(3100 + uint64_t(p == DType::BF16 ? 1 : 2), shape);
    const CaseStats st = check_case(cs, &pool2, g, p, &kernels::interpret_backend());
    EXPECT_GT(st.tokens, 0);
    if (HasFailure()) break;
  }
}

}  // namespace
}  // namespace lockstep::parity
