// The parity suite (fast part): randomized small models and prompts, the
// rollout engine under many scheduler settings vs the trainer, bit for bit;
// the localiser that names where two engines part; fast mode's bf16 KV cache.
// LOCKSTEP_PARITY_CASES and LOCKSTEP_PARITY_SEED widen or move the sweep.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>

#include "parity/parity_util.h"

namespace lockstep::parity {
namespace {

int64_t env_int(const char* name, int64_t fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::strtoll(v, nullptr, 10) : fallback;
}

// A fixed 3-layer MoE case for the localiser demos: n = 2 samples per prompt
// (prefix sharing), no early stops.
Case demo_case() {
  Case cs;
  cs.seed = 11;
  ModelConfig& c = cs.config;
  c.architecture = Architecture::Qwen3Moe;
  c.vocab_size = 48;
  c.hidden_size = 16;
  c.num_layers = 3;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 8;
  c.intermediate_size = 24;
  c.qk_norm = true;
  c.num_experts = 4;
  c.num_experts_per_tok = 2;
  c.moe_intermediate_size = 12;
  c.norm_topk_prob = true;
  c.mlp_only_layers = {0};
  c.max_position_embeddings = 128;
  std::mt19937_64 g(5);
  for (int i = 0; i < 6; ++i) {
    Request r;
    for (int j = 0; j < 5 + 3 * i; ++j) r.prompt_ids.push_back(int32_t(g() % 48));
    r.params.n = 2;
    r.params.max_new_tokens = 8;
    r.params.ignore_eos = true;
    r.params.seed = i;
    cs.requests.push_back(std::move(r));
    cs.max_len = std::max<int64_t>(cs.max_len, int64_t(cs.requests.back().prompt_ids.size()) + 8);
  }
  return cs;
}

Variation chunked_two_threads() {
  Variation v{"chunk 4, 2 threads", roomy_engine(), 2};
  v.engine.max_prefill_chunk = 4;
  v.engine.block_size = 4;
  return v;
}

}  // namespace

TEST(Parity, RandomCasesGiveTheTrainersLogprobsBitForBit) {
  const int64_t n_cases = env_int("LOCKSTEP_PARITY_CASES", 64);
  const uint64_t seed0 = uint64_t(env_int("LOCKSTEP_PARITY_SEED", 1000));
  ThreadPool pool2(2);
  std::mt19937_64 g(seed0);
  CaseStats total;
  std::map<std::string, int> archs;
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < n_cases; ++i) {
    const Case cs = random_case(seed0 + uint64_t(i));
    ++archs[architecture_name(cs.config.architecture)];
    const CaseStats st = check_case(cs, &pool2, g);
    total.tokens += st.tokens;
    total.runs += st.runs;
    total.preemptions += st.preemptions;
    total.max_batch = std::max(total.max_batch, st.max_batch);
    if (HasFailure()) break;
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf(
      "[parity] %lld cases (seeds %llu..), %lld engine runs matched, %lld sampled tokens, "
      "%lld preemptions, largest batch %lld sequences, %.1f s\n",
      (long long)n_cases, (unsigned long long)seed0, (long long)total.runs, (long long)total.tokens,
      (long long)total.preemptions, (long long)total.max_batch, secs);
  for (const auto& [a, n] : archs) std::printf("[parity]   %s: %d\n", a.c_str(), n);
  EXPECT_GT(total.tokens, 200);
  EXPECT_GT(total.preemptions, 0) << "the tiny-KV variations never preempted";
}

// The same on random DeepSeek-V4 shapes: chunked prefill splitting
// compression blocks and windows, prefix sharing, preemption, batching and
// threads, every sampled token's logprob equal to the trainer's.
TEST(Parity, RandomV4CasesGiveTheTrainersLogprobsBitForBit) {
  const int64_t n_cases = env_int("LOCKSTEP_PARITY_V4_CASES", 24);
  const uint64_t seed0 = uint64_t(env_int("LOCKSTEP_PARITY_SEED", 1000));
  ThreadPool pool2(2);
  std::mt19937_64 g(seed0);
  CaseStats total;
  for (int64_t i = 0; i < n_cases; ++i) {
    const Case cs = random_case(seed0 + uint64_t(i), {}, true);
    const CaseStats st = check_case(cs, &pool2, g);
    total.tokens += st.tokens;
    total.runs += st.runs;
    total.preemptions += st.preemptions;
    if (HasFailure()) break;
  }
  std::printf("[parity] %lld DeepSeek-V4 cases, %lld engine runs matched, %lld sampled tokens, %lld preemptions\n",
              (long long)n_cases, (long long)total.runs, (long long)total.tokens, (long long)total.preemptions);
  EXPECT_GT(total.tokens, 100);
  EXPECT_GT(total.preemptions, 0) << "the tiny-KV variations never preempted";
}

// Aligned at every precision: with bf16 or fp8 (power-of-two block scales)
// weights in both engines and the f32 KV cache the trainer also uses, every
// variation's logprobs equal the trainer's bit for bit, as in f32.
TEST(Parity, AlignedAtBf16AndFp8) {
  const int64_t n_cases = env_int("LOCKSTEP_PARITY_CASES", 64) / 4;
  const uint64_t seed0 = uint64_t(env_int("LOCKSTEP_PARITY_SEED", 1000)) + 500;
  ThreadPool pool2(2);
  for (DType precision : {DType::BF16, DType::FP8E4M3}) {
    std::mt19937_64 g(seed0);
    CaseStats total;
    for (int64_t i = 0; i < n_cases; ++i) {
      const CaseStats st = check_case(random_case(seed0 + uint64_t(i)), &pool2, g, precision);
      total.tokens += st.tokens;
      total.runs += st.runs;
      if (HasFailure()) return;
    }
    std::printf("[parity] %s: %lld cases, %lld engine runs matched the trainer, %lld sampled tokens\n",
                dtype_name(precision), (long long)n_cases, (long long)total.runs, (long long)total.tokens);
    EXPECT_GT(total.tokens, 50);
  }
}

// DeepSeek-V4 aligned in the official checkpoint's precisions: fp8 blocks and
// MXFP4 routed experts (expert_dtype = "fp4") in both engines, every
// variation's logprobs equal to the trainer's bit for bit.
TEST(Parity, AlignedV4AtFp8WithMxfp4Experts) {
  const int64_t n_cases = std::max<int64_t>(1, env_int("LOCKSTEP_PARITY_V4_CASES", 24) / 4);
  const uint64_t seed0 = uint64_t(env_int("LOCKSTEP_PARITY_SEED", 1000)) + 700;
  ThreadPool pool2(2);
  std::mt19937_64 g(seed0);
  CaseStats total;
  for (int64_t i = 0; i < n_cases; ++i) {
    Case cs = random_case(seed0 + uint64_t(i), {}, true);
    cs.config.expert_dtype = "fp4";  // MXFP4 groups of 32 along both expert widths
    cs.config.hidden_size = 32;
    cs.config.moe_intermediate_size = 32;
    cs.config.shared_expert_intermediate_size = 32;
    const Model m(cs.config, cs.seed);
    ASSERT_TRUE(m.packed(DType::FP8E4M3)->experts_mxfp4());
    const CaseStats st = check_case(cs, &pool2, g, DType::FP8E4M3);
    total.tokens += st.tokens;
    total.runs += st.runs;
    if (HasFailure()) return;
  }
  std::printf(
      "[parity] DeepSeek-V4 fp8 + MXFP4 experts: %lld cases, %lld engine runs matched the trainer, "
      "%lld sampled tokens\n",
      (long long)n_cases, (long long)total.runs, (long long)total.tokens);
  EXPECT_GT(total.tokens, 20);
}

// Bug found by this suite: a group whose samples had all been preempted came
// back through the queue and was admitted only in part; it stayed queued, so
// its admitted samples held KV blocks but were never scheduled. The engine
// then stalled, or cut other samples short ("no longer fit the KV cache") as
// if the cache were too small. Stepping is bounded here so a stall fails.
TEST(Parity, PartlyReadmittedGroupRunsToTheEnd) {
  ThreadPool pool2(2);
  int64_t preemptions = 0;
  for (uint64_t seed = 1000; seed < 1040; ++seed) {
    const Case cs = random_case(seed);
    SCOPED_TRACE(cs.describe());
    Model m(cs.config, cs.seed);
    std::mt19937_64 g(seed);
    const Variation tiny = variations_for(cs, g)[4];  // preemption under a tiny KV budget
    const auto base = run_engine(*m.weights, cs, variations_for(cs, g)[0], &pool2);
    rollout::Engine e(tiny.threads == 2 ? Context{&pool2, 0} : Context{}, m.weights.get(), tiny.engine);
    for (const Request& r : cs.requests) e.submit(r);
    int64_t steps = 0;
    while (steps < 20000 && e.step()) ++steps;
    ASSERT_LT(steps, 20000) << tiny.name << ": the engine stalled";
    preemptions += e.stats().preemptions;
    EXPECT_EQ(first_output_difference(base, e.run_until_done()), "") << tiny.name;
  }
  EXPECT_GT(preemptions, 0);
}

// 64 prompts x 4 samples decoding together: batches of 256 sequences against
// batches of one request, both against the trainer.
TEST(Parity, BatchOf256MatchesBatchOfOne) {
  ThreadPool pool2(2);
  for (uint64_t seed : {7u, 8u}) {
    Case cs = random_case(seed, {.max_prompts = 1, .max_prompt_len = 12, .max_new_tokens = 4, .max_n = 1});
    cs.requests.clear();
    std::mt19937_64 g(seed);
    for (int i = 0; i < 64; ++i) {
      Request r;
      for (int j = 0; j < 1 + int(g() % 12); ++j)
        r.prompt_ids.push_back(int32_t(g() % uint64_t(cs.config.vocab_size)));
      r.params.n = 4;
      r.params.max_new_tokens = 3;
      r.params.ignore_eos = true;
      r.params.temperature = i % 3 == 0 ? 0.0f : 0.8f;
      r.params.seed = i;
      cs.max_len = std::max<int64_t>(cs.max_len, int64_t(r.prompt_ids.size()) + 3);
      cs.requests.push_back(std::move(r));
    }
    SCOPED_TRACE(cs.describe());
    Model m(cs.config, seed);
    Variation wide{"256 at once", roomy_engine(), 2};
    int64_t max_batch = 0;
    wide.engine.capture = [&](const model::Captured& c) {
      if (c.layer == -1) max_batch = std::max<int64_t>(max_batch, c.seq[c.rows() - 1] + 1);
    };
    const auto a = run_engine(*m.weights, cs, wide, &pool2);
    EXPECT_EQ(max_batch, 256);
    Variation one{"one request at a time", roomy_engine(), 1};
    one.engine.max_running = 1;
    one.engine.prefix_cache = false;
    const auto b = run_engine(*m.weights, cs, one, &pool2);
    EXPECT_EQ(first_output_difference(a, b), "");
    const Gap gap = logprob_gap(a, trainer_logprobs(m, cs, a, Context{&pool2, 0}, 1 << 20, 16));
    EXPECT_EQ(gap.differing, 0) << gap.first_bad;
    EXPECT_EQ(gap.tokens, 64 * 4 * 3);
  }
}

// With nothing wrong, every intermediate the engine computes has the
// trainer's bits, and every rollout row finds its trainer row.
TEST(Localise, FindsNoDivergenceWhenAligned) {
  ThreadPool pool2(2);
  for (uint64_t seed : {1003u, 1004u, 1005u}) {
    const Case cs = random_case(seed);
    SCOPED_TRACE(cs.describe());
    Model m(cs.config, cs.seed);
    std::mt19937_64 g(seed);
    const auto vars = variations_for(cs, g);
    for (const Variation& v : {vars[2], vars[4]}) {  // chunked prefill; preemption
      const Localisation loc = localise(*m.weights, *m.weights, cs, v, &pool2);
      EXPECT_FALSE(loc.first.found) << v.name << ": " << loc.first.str();
      EXPECT_GT(loc.compared_rows, 0);
      EXPECT_EQ(loc.missing_rows, 0);
      EXPECT_EQ(loc.unmatched_points, 0);
    }
  }
}

// A fault injected into one intermediate of one decode row of the rollout is
// found by the parity check and named by the localiser.
TEST(Localise, NamesAnInjectedFaultsLayerPointAndPosition) {
  const Case cs = demo_case();
  Model m(cs.config, cs.seed);
  ThreadPool pool2(2);
  const int64_t prompt_len = int64_t(cs.requests[1].prompt_ids.size());
  const uint64_t victim = rollout::capture_key(2, 1);  // request 2 (ids start at 1), sample 1
  const int32_t pos = int32_t(prompt_len + 3);         // a decode row: feeds output token 3
  struct Fault {
    int64_t layer;
    const char* name;
  };
  for (const Fault f : {Fault{1, "ffn_norm"}, Fault{2, "v"}, Fault{0, "attn"}, Fault{1, "experts"}}) {
    SCOPED_TRACE(std::string("fault in layer ") + std::to_string(f.layer) + " " + f.name);
    model::CaptureFn fault = [&](const model::Captured& c) {
      if (c.layer != f.layer || std::string(c.name) != f.name) return;
      for (int64_t r = 0; r < c.rows(); ++r) {
        if (c.id(r) != victim || c.pos[r] != pos) continue;
        if (c.data.dtype == DType::I32) {
          // Route the first slot to an expert the router did not choose.
          int32_t* e = c.data.i32() + r * c.cols();
          int32_t x = 0;
          while (x == e[0] || x == e[1]) ++x;
          e[0] = x;
        } else {
          c.data.f32()[r * c.cols() + 1] += 0.25f;
        }
      }
    };
    // The parity check sees it: the sample's logprobs agree with the trainer's
    // up to output token 3 and differ from token 4 (predicted from row `pos`).
    Variation v = chunked_two_threads();
    v.engine.capture = fault;
    const auto out = run_engine(*m.weights, cs, v, &pool2);
    const auto train = trainer_logprobs(m, cs, out, Context{}, 1 << 20, 16);
    const auto& lp = out[1].samples[1].logprobs;
    const auto& tl = train[1 * 2 + 1];
    ASSERT_EQ(lp.size(), 8u);
    for (size_t j = 0; j < 4; ++j) EXPECT_EQ(0, std::memcmp(&lp[j], &tl[j], 4)) << "token " << j;
    EXPECT_NE(0, std::memcmp(&lp[4], &tl[4], 4));
    const Gap gap = logprob_gap(out, train);
    EXPECT_GT(gap.differing, 0);

    const Localisation loc = localise(*m.weights, *m.weights, cs, chunked_two_threads(), &pool2, fault);
    std::printf("[localise] injected into layer %lld '%s' at %s position %d -> %s\n", (long long)f.layer,
                f.name, sample_name(victim).c_str(), pos, loc.first.str().c_str());
    ASSERT_TRUE(loc.first.found);
    EXPECT_EQ(loc.first.layer, f.layer);
    EXPECT_EQ(loc.first.name, f.name);
    EXPECT_EQ(loc.first.id, victim);
    EXPECT_EQ(loc.first.pos, pos);
    EXPECT_EQ(loc.first.rows_differing, 1);
    EXPECT_EQ(loc.missing_rows, 0);
  }
}

// Fast mode's first difference is the first projection: bf16 weights change
// q (layer 0) while the embedding and the norms stay f32.
TEST(Localise, NamesTheFirstProjectionForBf16Weights) {
  const Case cs = demo_case();
  Model m(cs.config, cs.seed);
  ThreadPool pool2(2);
  const auto bf16 = m.packed(DType::BF16);
  const Localisation loc = localise(*bf16, *m.weights, cs, chunked_two_threads(), &pool2);
  std::printf("[localise] bf16 rollout weights vs f32 trainer -> %s\n", loc.first.str().c_str());
  ASSERT_TRUE(loc.first.found);
  EXPECT_EQ(loc.first.layer, 0);
  EXPECT_EQ(loc.first.name, "q");
  EXPECT_EQ(loc.first.pos, 0);
}

// Fast mode keeps its KV cache in bf16 (half the memory and decode traffic);
// within fast mode the engine is still batch-invariant bit for bit, and its
// logprobs stay close to the trainer's f32 ones.
TEST(FastMode, Bf16KvCacheIsBatchInvariantAndClose) {
  ThreadPool pool2(2);
  for (DType storage : {DType::BF16, DType::FP8E4M3}) {
    for (uint64_t seed : {2001u, 2002u, 2003u}) {
      const Case cs = random_case(seed);
      SCOPED_TRACE(cs.describe() + " storage " + dtype_name(storage));
      Model m(cs.config, cs.seed);
      const auto fast = m.packed(storage);
      {
        rollout::Engine aligned(Context{}, m.weights.get(), roomy_engine());
        EXPECT_EQ(aligned.kv_dtype(), DType::F32);
        rollout::EngineConfig bf16_kv = roomy_engine();
        bf16_kv.bf16_kv = true;
        rollout::Engine e(Context{}, fast.get(), bf16_kv);
        EXPECT_EQ(e.kv_dtype(), DType::BF16);
        rollout::Engine f32_kv(Context{}, fast.get(), roomy_engine());
        EXPECT_EQ(f32_kv.kv_dtype(), DType::F32) << "a bf16 cache only when asked";
      }
      std::mt19937_64 g(seed);
      auto vars = variations_for(cs, g);
      for (auto& v : vars) v.engine.bf16_kv = true;
      const auto base = run_engine(*fast, cs, vars[0], &pool2);
      for (size_t i = 1; i < vars.size(); ++i)
        EXPECT_EQ(first_output_difference(base, run_engine(*fast, cs, vars[i], &pool2)), "") << vars[i].name;
      const Gap gap = logprob_gap(base, trainer_logprobs(m, cs, base, Context{}, 1 << 20, 16));
      EXPECT_GT(gap.tokens, 0);
      EXPECT_GT(gap.differing, 0) << "fast mode should not match f32 bit for bit";
      // Not bounded token by token (a flipped top-k expert choice moves a
      // logprob a lot, and these tiny random models are peaked), but the
      // typical token's gap is small.
      std::printf(
          "[fast mode] %s seed %llu: %lld tokens, %lld differ, |diff| median %.4f mean %.4f max %.4f\n",
          dtype_name(storage), (unsigned long long)seed, (long long)gap.tokens, (long long)gap.differing,
          gap.median_abs(), gap.mean_abs(), gap.max_abs);
      EXPECT_LT(gap.median_abs(), storage == DType::BF16 ? 0.05 : 0.4);
      // The bf16 cache is what changed: with an f32 cache the same weights give other bits.
      Variation f32kv = vars[0];
      f32kv.engine.bf16_kv = false;
      EXPECT_NE(first_output_difference(base, run_engine(*fast, cs, f32kv, &pool2)), "");
    }
  }
}

// model::forward over a bf16 cache: a sequence fed whole, in chunks or token
// by token gives the same logits bits (the cache rounds K/V once, on write,
// and every later read widens the same bits), and not those of an f32 cache.
TEST(FastMode, Bf16KvForwardIsChunkingInvariant) {
  for (uint64_t seed : {3001u, 3002u, 3003u, 3004u}) {
    std::mt19937_64 g(seed);
    const ModelConfig c = random_config(g);
    SCOPED_TRACE(std::string(architecture_name(c.architecture)) + " seed " + std::to_string(seed));
    Model m(c, seed);
    const auto w = m.packed(DType::BF16);
    std::vector<int32_t> tokens;
    for (int i = 0; i < 45; ++i) tokens.push_back(int32_t(g() % uint64_t(c.vocab_size)));
    auto run = [&](DType kv_dtype, const std::vector<int>& chunks, int threads) {
      ThreadPool pool(threads);
      model::KvCache kv(c, 3, 16, kv_dtype);
      model::Workspace ws;
      std::vector<float> logits;
      int32_t n_ctx = 0;
      for (int n : chunks) {
        model::RaggedBatch b;
        b.tokens.assign(tokens.begin() + n_ctx, tokens.begin() + n_ctx + n);
        b.n_ctx = {n_ctx};
        b.n_new = {n};
        b.block_table = {2, 0, 1};  // out of order on purpose
        b.max_blocks = 3;
        for (int r = 0; r < n; ++r) b.logit_rows.push_back(r);
        model::ForwardResult fr;
        model::forward(Context{&pool, 0}, *w, kv, ws, b, {}, &fr);
        logits.insert(logits.end(), fr.logits.f32(), fr.logits.f32() + fr.logits.view().numel());
        n_ctx += n;
      }
      return logits;
    };
    const auto whole = run(DType::BF16, {45}, 1);
    const auto chunked = run(DType::BF16, {5, 1, 13, 26}, 2);
    const auto stepwise = run(DType::BF16, std::vector<int>(45, 1), 1);
    ASSERT_EQ(whole.size(), size_t(45 * c.vocab_size));
    EXPECT_EQ(0, std::memcmp(whole.data(), chunked.data(), whole.size() * 4));
    EXPECT_EQ(0, std::memcmp(whole.data(), stepwise.data(), whole.size() * 4));
    EXPECT_NE(0, std::memcmp(whole.data(), run(DType::F32, {45}, 1).data(), whole.size() * 4));
  }
}

}  // namespace lockstep::parity
