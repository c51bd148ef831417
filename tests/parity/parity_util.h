// The parity suite's cases, in the spirit of llama.cpp's test-backend-ops: a
// seeded generator draws a small model (dense or MoE, GQA ratio, head width,
// q/k-norm, q/k/v bias, tied embeddings, softmax or sigmoid router, shared
// experts, dense layers), prompts of mixed lengths with repeated prefixes,
// and sampling settings; each case runs the rollout engine under several
// scheduler settings (batch size, chunked prefill, prefix sharing,
// preemption, threads, KV block size) and the trainer rescoring its samples.
// Aligned mode must give the same tokens and the trainer's logprobs bit for
// bit in every run; on a failure the localiser (localise.h) names the first
// intermediate where rollout and trainer part.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "lockstep/kernels/gpu/backend.h"
#include "lockstep/model/params.h"
#include "lockstep/model/weights.h"
#include "lockstep/rollout/engine.h"
#include "lockstep/train/trainer.h"
#include "parity/localise.h"

namespace lockstep::parity {

using rollout::EngineConfig;
using rollout::Request;
using rollout::RequestResult;

// A model with its f32 master parameters.
struct Model {
  Model(const ModelConfig& c, uint64_t seed) : layout(c), params(alloc_params(layout)) {
    init_params(layout, params.as<float>(), seed, 0.5f);  // large init: peaked, varied outputs
    // Norm scales and biases start at 1 and 0; make them matter.
    std::mt19937_64 g(seed ^ 0x5eedull);
    std::normal_distribution<float> d(0.0f, 0.3f);
    ModelParams p = bind(layout, params.as<float>());
    auto jitter = [&](const Tensor& t, float base) {
      if (t.data == nullptr) return;
      for (int64_t i = 0; i < t.numel(); ++i) t.f32()[i] = base + d(g);
    };
    for (const auto& l : p.layers) {
      jitter(l.attn_norm, 1.0f);
      jitter(l.mlp_norm, 1.0f);
      jitter(l.q_norm, 1.0f);
      jitter(l.k_norm, 1.0f);
      jitter(l.bqkv, 0.0f);
      jitter(l.router_bias, 0.0f);
    }
    jitter(p.final_norm, 1.0f);
    weights = std::make_unique<model::ModelWeights>(Context{}, layout, params.as<float>());
  }
  // Weights packed in another precision (fast mode), over the same master copy.
  std::unique_ptr<model::ModelWeights> packed(DType storage) const {
    return std::make_unique<model::ModelWeights>(Context{}, layout, params.as<float>(), storage,
                                                 storage == DType::FP8E4M3 ? 16 : 0);
  }
  ParamLayout layout;
  Buffer params;
  std::unique_ptr<model::ModelWeights> weights;
};

struct Case {
  uint64_t seed = 0;
  ModelConfig config;
  std::vector<Request> requests;
  int64_t max_len = 0;  // longest prompt + max_new_tokens

  std::string describe() const {
    const ModelConfig& c = config;
    std::ostringstream os;
    os << "case seed " << seed << ": " << architecture_name(c.architecture) << " V=" << c.vocab_size
       << " D=" << c.hidden_size << " L=" << c.num_layers << " H=" << c.num_heads << " Hkv=" << c.num_kv_heads
       << " Dh=" << c.head_dim << (c.qk_norm ? " qk_norm" : "") << (c.qkv_bias ? " qkv_bias" : "")
       << (c.tie_word_embeddings ? " tied" : "");
    if (c.is_moe()) {
      os << " E=" << c.num_experts << " K=" << c.num_experts_per_tok << " "
         << router_scoring_name(c.router_scoring) << (c.norm_topk_prob ? " norm_topk" : "")
         << " shared=" << c.n_shared_experts << (c.shared_expert_gate ? " gated" : "")
         << " first_k_dense=" << c.first_k_dense_replace << " sparse_step=" << c.decoder_sparse_step
         << " n_group=" << c.n_group << "/" << c.topk_group;
    }
    int64_t lo = 1 << 30, hi = 0, samples = 0;
    for (const auto& r : requests) {
      lo = std::min<int64_t>(lo, int64_t(r.prompt_ids.size()));
      hi = std::max<int64_t>(hi, int64_t(r.prompt_ids.size()));
      samples += r.params.n;
    }
    os << "; " << requests.size() << " prompts (len " << lo << ".." << hi << "), " << samples << " samples";
    return os.str();
  }
};

// What a case may draw; the slow sweep widens it.
struct CaseShape {
  int max_prompts = 10;
  int max_prompt_len = 40;
  int max_new_tokens = 12;
  int max_n = 4;
};

inline ModelConfig random_config(std::mt19937_64& g) {
  auto pick = [&](std::initializer_list<int64_t> xs) { return *(xs.begin() + g() % xs.size()); };
  auto coin = [&](double p = 0.5) { return std::uniform_real_distribution<double>(0, 1)(g) < p; };
  ModelConfig c;
  const Architecture archs[] = {Architecture::Llama,    Architecture::Qwen2,    Architecture::Qwen3,
                                Architecture::Qwen2Moe, Architecture::Qwen3Moe, Architecture::Dots1};
  c.architecture = archs[g() % 6];
  c.vocab_size = 24 + int64_t(g() % 80);
  c.hidden_size = pick({8, 12, 16, 24, 32});
  c.num_layers = 1 + int64_t(g() % 3);
  c.num_kv_heads = pick({1, 2, 4});
  c.num_heads = c.num_kv_heads * pick({1, 2, 4});  // GQA ratios 1, 2, 4
  c.head_dim = pick({2, 4, 6, 8, 12, 16});
  c.intermediate_size = 8 + int64_t(g() % 33);
  c.rope_theta = coin() ? 10000.0 : 1e6;
  c.tie_word_embeddings = coin();
  c.max_position_embeddings = 128;
  c.qk_norm = c.architecture == Architecture::Qwen3 || c.architecture == Architecture::Qwen3Moe ||
              c.architecture == Architecture::Dots1;
  c.qkv_bias = c.architecture == Architecture::Qwen2 || c.architecture == Architecture::Qwen2Moe;
  if (c.architecture == Architecture::Qwen2Moe || c.architecture == Architecture::Qwen3Moe ||
      c.architecture == Architecture::Dots1) {
    c.num_experts = pick({2, 3, 4, 6, 8});
    c.num_experts_per_tok = 1 + int64_t(g() % std::min<uint64_t>(3, uint64_t(c.num_experts)));
    c.moe_intermediate_size = 4 + int64_t(g() % 21);
    c.norm_topk_prob = coin();
    if (c.architecture == Architecture::Dots1) {
      c.router_scoring = RouterScoring::Sigmoid;
      c.score_correction_bias = true;
      c.routed_scaling_factor = coin() ? 1.0 : 2.5;
      c.n_shared_experts = 1 + int64_t(g() % 2);
      c.shared_expert_intermediate_size = c.n_shared_experts * c.moe_intermediate_size;
      c.first_k_dense_replace = c.num_layers > 1 ? int64_t(g() % 2) : 0;
      if (c.num_experts % 2 == 0 && coin()) {  // group-limited routing
        c.n_group = 2;
        c.topk_group = c.num_experts / 2 >= c.num_experts_per_tok && coin() ? 1 : 2;
      }
    } else {
      if (c.architecture == Architecture::Qwen2Moe) {
        c.n_shared_experts = 1;
        c.shared_expert_gate = true;
        c.shared_expert_intermediate_size = 4 + int64_t(g() % 21);
      }
      if (coin(0.3)) c.decoder_sparse_step = 2;
      if (c.num_layers > 1 && coin(0.3)) c.mlp_only_layers = {int64_t(g() % uint64_t(c.num_layers))};
    }
  }
  c.eos_token_ids = {int64_t(g() % uint64_t(c.vocab_size))};  // some samples stop early
  return c;
}

// A random DeepSeek-V4 shape: every part at toy width, layer ratios drawn
// from 0 and 4 (a ratio-128 entry needs 128 positions; now and then one such
// layer runs with none), hash layers, mHC with 1 to 3 streams.
inline ModelConfig random_v4_config(std::mt19937_64& g) {
  auto pick = [&](std::initializer_list<int64_t> xs) { return *(xs.begin() + g() % xs.size()); };
  ModelConfig c;
  c.architecture = Architecture::DeepseekV4;
  c.vocab_size = 24 + int64_t(g() % 80);
  c.hidden_size = pick({8, 12, 16, 24});
  c.num_layers = 1 + int64_t(g() % 3);
  c.o_groups = pick({1, 2});
  c.num_heads = c.o_groups * pick({1, 2});
  c.num_kv_heads = 1;
  c.head_dim = pick({6, 8, 12});
  c.qk_rope_head_dim = pick({2, 4});
  c.q_lora_rank = pick({4, 8, 12});
  c.o_lora_rank = pick({4, 6, 8});
  c.sliding_window = pick({2, 5, 8, 64});
  for (int64_t l = 0; l < c.num_layers; ++l)
    c.compress_ratios.push_back(g() % 8 == 0 ? 128 : pick({0, 4, 4}));
  c.compress_rope_theta = 160000.0;
  if (g() % 2 == 0) c.rope_scaling = {"yarn", 4.0, 32, 32.0, 1.0};
  c.max_position_embeddings = 128;
  c.index_n_heads = pick({1, 2});
  c.index_head_dim = c.qk_rope_head_dim + pick({0, 2, 4});
  c.index_topk = pick({1, 2, 3});
  c.num_experts = pick({2, 3, 4, 6});
  c.num_experts_per_tok = 1 + int64_t(g() % std::min<uint64_t>(3, uint64_t(c.num_experts)));
  c.moe_intermediate_size = 4 + int64_t(g() % 13);
  c.n_shared_experts = 1;
  c.shared_expert_intermediate_size = c.moe_intermediate_size;
  c.router_scoring = RouterScoring::SqrtSoftplus;
  c.norm_topk_prob = true;
  c.routed_scaling_factor = 1.5;
  c.score_correction_bias = true;
  c.num_hash_layers = int64_t(g() % uint64_t(c.num_layers + 1));
  c.swiglu_limit = pick({0, 1, 10});
  c.hc_mult = 1 + int64_t(g() % 3);
  c.hc_sinkhorn_iters = pick({1, 5, 20});
  c.eos_token_ids = {int64_t(g() % uint64_t(c.vocab_size))};
  return c;
}

inline Case random_case(uint64_t seed, const CaseShape& shape = {}, bool v4 = false) {
  std::mt19937_64 g(seed);
  Case cs;
  cs.seed = seed;
  cs.config = v4 ? random_v4_config(g) : random_config(g);
  const int64_t V = cs.config.vocab_size;
  const int n_prompts = 1 + int(g() % uint64_t(shape.max_prompts));
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < n_prompts; ++i) {
    std::vector<int32_t> p;
    // Mixed lengths, and now and then a prompt that repeats or extends an
    // earlier one (prefix-cache hits across requests).
    if (!prompts.empty() && g() % 4 == 0) p = prompts[g() % prompts.size()];
    if (!p.empty() && g() % 2 == 0) p.resize(1 + g() % p.size());
    const int64_t len = 1 + int64_t(g() % uint64_t(shape.max_prompt_len));
    while (int64_t(p.size()) < len) p.push_back(int32_t(g() % uint64_t(V)));
    prompts.push_back(p);
  }
  for (auto& p : prompts) {
    Request r;
    r.prompt_ids = p;
    const float temps[] = {1.0f, 0.7f, 1.3f, 0.0f};
    r.params.temperature = temps[g() % 4];
    r.params.n = 1 + int64_t(g() % uint64_t(shape.max_n));
    r.params.max_new_tokens = 1 + int64_t(g() % uint64_t(shape.max_new_tokens));
    r.params.seed = int64_t(g() % 1000);
    if (g() % 4 == 0) r.params.top_k = 1 + int64_t(g() % 8);
    if (g() % 4 == 0) r.params.top_p = 0.8f;
    cs.max_len = std::max<int64_t>(cs.max_len, int64_t(p.size()) + r.params.max_new_tokens);
    cs.requests.push_back(std::move(r));
  }
  return cs;
}

// One way of running the engine.
struct Variation {
  std::string name;
  EngineConfig engine;
  int threads = 1;
  // The rollout engine's GPU backend (null: the CPU kernels); the trainer
  // always runs on the CPU.
  const kernels::GpuBackend* gpu = nullptr;
};

inline EngineConfig roomy_engine() {
  EngineConfig e;
  e.num_blocks = 4096;
  e.block_size = 16;
  e.max_batch_tokens = 4096;
  e.max_running = 256;
  e.max_prefill_chunk = 512;
  e.prefix_cache = true;
  return e;
}

// The scheduler settings a case is run under: the first is the baseline the
// others are compared with.
inline std::vector<Variation> variations_for(const Case& cs, std::mt19937_64& g) {
  std::vector<Variation> v;
  v.push_back({"baseline (all at once, whole prompts, prefix cache)", roomy_engine(), 1});
  {
    Variation x{"batch size 1 (max_running=1, no prefix cache)", roomy_engine(), 1};
    x.engine.max_running = 1;
    x.engine.prefix_cache = false;
    v.push_back(x);
  }
  {
    Variation x{"", roomy_engine(), 1};
    x.engine.max_running = 1 + int64_t(g() % 7);
    x.engine.max_prefill_chunk = 1 + int64_t(g() % 7);
    x.engine.max_batch_tokens = 2 + int64_t(g() % 15);
    x.engine.block_size = int(1 + g() % 5);
    x.name = "chunked prefill (chunk " + std::to_string(x.engine.max_prefill_chunk) + ", " +
             std::to_string(x.engine.max_batch_tokens) + " tokens/step, max_running " +
             std::to_string(x.engine.max_running) + ", block " + std::to_string(x.engine.block_size) + ")";
    v.push_back(x);
  }
  {
    Variation x{"no prefix cache, 2 threads, block 3", roomy_engine(), 2};
    x.engine.prefix_cache = false;
    x.engine.block_size = 3;
    v.push_back(x);
  }
  {
    // Tiny KV budget: one longest sample fits (plus one spare block), so
    // samples are preempted and recomputed, and none is cut short.
    Variation x{"", roomy_engine(), int(1 + g() % 2)};
    x.engine.block_size = int(2 + g() % 3);
    x.engine.num_blocks =
        (cs.max_len + 1 + x.engine.block_size - 1) / x.engine.block_size + 1 + int64_t(g() % 3);
    x.engine.max_prefill_chunk = 1 + int64_t(g() % 9);
    x.name = "preemption (" + std::to_string(x.engine.num_blocks) + " blocks of " +
             std::to_string(x.engine.block_size) + ", chunk " + std::to_string(x.engine.max_prefill_chunk) +
             ", " + std::to_string(x.threads) + " threads)";
    v.push_back(x);
  }
  {
    Variation x{"2 threads, prefix cache, chunk 5, block 1", roomy_engine(), 2};
    x.engine.max_prefill_chunk = 5;
    x.engine.block_size = 1;
    v.push_back(x);
  }
  return v;
}

inline std::vector<RequestResult> run_engine(const model::ModelWeights& w, const Case& cs, const Variation& v,
                                             ThreadPool* pool2, int64_t* preemptions = nullptr) {
  Context ctx = v.threads == 2 ? Context{pool2, 0} : Context{};
  ctx.gpu = v.gpu;
  // On a GPU backend the engine reads weights in its device memory: the same
  // master packed there (a copy of the f32 master, the same packed bits).
  std::unique_ptr<model::ModelWeights> on_device;
  if (v.gpu)
    on_device = std::make_unique<model::ModelWeights>(ctx, w.layout(), const_cast<float*>(w.flat()),
                                                      w.storage(), w.fp8_block());
  rollout::Engine e(ctx, on_device ? on_device.get() : &w, v.engine);
  auto out = e.generate(cs.requests);
  if (preemptions) *preemptions = e.stats().preemptions;
  return out;
}

// The trainer's logprobs of every sample of `results`, flattened in (request,
// sample) order; samples are scored at their request's logprob temperature.
inline std::vector<std::vector<float>> trainer_logprobs(const Model& m, const Case& cs,
                                                        const std::vector<RequestResult>& results,
                                                        const Context& ctx, int64_t micro_batch_tokens,
                                                        int kv_block_size, DType precision = DType::F32,
                                                        int64_t logits_chunk = 0) {
  Buffer copy(m.layout.nbytes());
  std::memcpy(copy.data(), m.params.data(), m.layout.nbytes());
  train::TrainerConfig tc;
  tc.micro_batch_tokens = micro_batch_tokens;
  tc.logits_chunk = logits_chunk;
  tc.kv_block_size = kv_block_size;
  tc.precision = precision;
  tc.fp8_block = 16;  // as Model::packed
  train::Trainer t(ctx, m.layout.config(), std::move(copy), tc);
  std::map<float, std::vector<size_t>> by_temperature;  // flat sample indices
  std::vector<train::TrainSequence> seqs;
  std::vector<float> temps;
  for (size_t i = 0; i < results.size(); ++i)
    for (const auto& s : results[i].samples) {
      train::TrainSequence ts;
      ts.tokens = results[i].prompt_ids;
      ts.tokens.insert(ts.tokens.end(), s.output_ids.begin(), s.output_ids.end());
      ts.prompt_len = int32_t(results[i].prompt_ids.size());
      by_temperature[cs.requests[i].params.logprob_temperature()].push_back(seqs.size());
      seqs.push_back(std::move(ts));
    }
  std::vector<std::vector<float>> out(seqs.size());
  for (const auto& [temp, idx] : by_temperature) {
    std::vector<train::TrainSequence> group;
    for (size_t i : idx) group.push_back(seqs[i]);
    train::ScoreOptions so;
    so.temperature = temp;
    auto sc = t.score(group, so);
    for (size_t j = 0; j < idx.size(); ++j) out[idx[j]] = std::move(sc[j].logp);
  }
  return out;
}

// First sample/token whose bits differ between two runs' tokens or logprobs
// ("" when they agree).
inline std::string first_output_difference(const std::vector<RequestResult>& a,
                                           const std::vector<RequestResult>& b) {
  if (a.size() != b.size()) return "different request counts";
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].samples.size() != b[i].samples.size())
      return "request " + std::to_string(i) + ": sample counts differ";
    for (size_t k = 0; k < a[i].samples.size(); ++k) {
      const auto &x = a[i].samples[k], &y = b[i].samples[k];
      const std::string where = "request " + std::to_string(i) + " sample " + std::to_string(k);
      if (x.output_ids != y.output_ids) return where + ": tokens differ";
      if (x.finish_reason != y.finish_reason) return where + ": finish reasons differ";
      if (x.logprobs.size() != y.logprobs.size() ||
          std::memcmp(x.logprobs.data(), y.logprobs.data(), x.logprobs.size() * 4) != 0)
        return where + ": logprob bits differ";
    }
  }
  return "";
}

// Largest |rollout - trainer| logprob gap and the number of tokens compared;
// *first_bad names the first token whose bits differ.
struct Gap {
  double max_abs = 0, sum_abs = 0;
  int64_t tokens = 0, differing = 0;
  std::string first_bad;
  std::vector<double> diffs;  // |diff| of every token
  double mean_abs() const { return tokens ? sum_abs / double(tokens) : 0.0; }
  double median_abs() const {
    if (diffs.empty()) return 0.0;
    std::vector<double> d = diffs;
    std::nth_element(d.begin(), d.begin() + ptrdiff_t(d.size() / 2), d.end());
    return d[d.size() / 2];
  }
};
inline Gap logprob_gap(const std::vector<RequestResult>& results,
                       const std::vector<std::vector<float>>& train) {
  Gap g;
  size_t flat = 0;
  for (size_t i = 0; i < results.size(); ++i)
    for (size_t k = 0; k < results[i].samples.size(); ++k, ++flat) {
      const auto& lp = results[i].samples[k].logprobs;
      if (flat >= train.size() || train[flat].size() != lp.size()) {
        g.first_bad =
            "request " + std::to_string(i) + " sample " + std::to_string(k) + ": token counts differ";
        g.differing += 1;
        continue;
      }
      for (size_t j = 0; j < lp.size(); ++j) {
        ++g.tokens;
        const double d = std::fabs(double(lp[j]) - double(train[flat][j]));
        g.max_abs = std::max(g.max_abs, d);
        g.sum_abs += d;
        g.diffs.push_back(d);
        if (std::memcmp(&lp[j], &train[flat][j], 4) != 0) {
          if (g.differing++ == 0) {
            std::ostringstream os;
            os << "request " << i << " sample " << k << " token " << j << ": rollout " << lp[j] << " trainer "
               << train[flat][j];
            g.first_bad = os.str();
          }
        }
      }
    }
  return g;
}

// Re-runs the engine with a comparing capture hook against the trainer's
// forward of the same samples. `fault` (optional) runs first on each rollout
// capture (tests inject faults with it).
struct Localisation {
  Divergence first;
  int64_t compared_rows = 0, missing_rows = 0, unmatched_points = 0;
};
inline Localisation localise(const model::ModelWeights& rollout_weights,
                             const model::ModelWeights& trainer_weights, const Case& cs, const Variation& v,
                             ThreadPool* pool2, const model::CaptureFn& fault = {}) {
  // The samples come from a first (plain or faulty) run; the capturing re-run
  // is deterministic, so it reproduces them.
  Variation run = v;
  run.engine.capture = fault;
  const auto results = run_engine(rollout_weights, cs, run, pool2);
  const CaptureReference ref = trainer_reference(Context{}, trainer_weights, samples_of(results));
  CaptureComparer cmp(ref);
  run.engine.capture = [&](const model::Captured& c) {
    if (fault) fault(c);
    cmp(c);
  };
  run_engine(rollout_weights, cs, run, pool2);
  return {cmp.first(), cmp.compared_rows(), cmp.missing_rows(), cmp.unmatched_points()};
}

// What a case exercised.
struct CaseStats {
  int64_t tokens = 0;       // rollout tokens of the baseline (each checked in every variation)
  int64_t runs = 0;         // engine runs that matched
  int64_t preemptions = 0;  // over all variations
  int64_t max_batch = 0;    // most sequences in one baseline forward step
};

// Runs one case: every variation must give the baseline's tokens and logprob
// bits, and those must equal the trainer's (1 and 2 threads, small and large
// micro-batches). At bf16 or fp8 both engines run in that precision (aligned).
inline CaseStats check_case(const Case& cs, ThreadPool* pool2, std::mt19937_64& g,
                            DType precision = DType::F32, const kernels::GpuBackend* rollout_gpu = nullptr) {
  SCOPED_TRACE(cs.describe() + " precision " + dtype_name(precision) +
               (rollout_gpu ? std::string(", rollout on the ") + rollout_gpu->name + " backend" : ""));
  CaseStats st;
  Model m(cs.config, cs.seed);
  std::unique_ptr<model::ModelWeights> packed;
  if (precision != DType::F32) packed = m.packed(precision);
  const model::ModelWeights& weights = packed ? *packed : *m.weights;
  auto vars = variations_for(cs, g);
  for (Variation& v : vars) v.gpu = rollout_gpu;
  Variation counted = vars[0];
  counted.engine.capture = [&](const model::Captured& c) {
    if (c.layer == -1 && c.rows() > 0)
      st.max_batch = std::max<int64_t>(st.max_batch, c.seq[c.rows() - 1] + 1);
  };
  const auto base = run_engine(weights, cs, counted, pool2);
  for (const auto& r : base)
    for (const auto& s : r.samples) st.tokens += int64_t(s.logprobs.size());
  auto report = [&](const Variation& v, const std::string& what) {
    const Localisation loc = localise(weights, weights, cs, v, pool2);
    ADD_FAILURE() << cs.describe() << "\n  variation: " << v.name << "\n  " << what
                  << "\n  localiser: " << loc.first.str() << " [" << loc.compared_rows << " rows compared, "
                  << loc.missing_rows << " unmatched]";
  };
  const int64_t mb = 1 + int64_t(g() % 64);
  // The trainer takes its logits all at once, and in chunks of a few rows.
  const int block2 = int(1 + g() % 8);
  const int64_t chunk2 = 1 + int64_t(g() % 16);
  for (auto [threads, micro, block, chunk] :
       {std::tuple{1, int64_t(1 << 20), 16, int64_t(0)}, std::tuple{2, mb, block2, chunk2}}) {
    const auto train = trainer_logprobs(m, cs, base, threads == 2 ? Context{pool2, 0} : Context{}, micro,
                                        block, precision, chunk);
    const Gap gap = logprob_gap(base, train);
    if (gap.differing != 0 || gap.tokens == 0) {
      std::ostringstream os;
      os << "trainer (" << threads << " threads, micro-batch " << micro << " tokens, block " << block
         << ", logits chunk " << chunk << ") differs: " << gap.differing << " of " << gap.tokens
         << " tokens, max |diff| " << gap.max_abs << "; first: " << gap.first_bad;
      report(vars[0], os.str());
      return st;
    }
  }
  ++st.runs;
  for (size_t i = 1; i < vars.size(); ++i) {
    int64_t preemptions = 0;
    const auto out = run_engine(weights, cs, vars[i], pool2, &preemptions);
    st.preemptions += preemptions;
    const std::string diff = first_output_difference(base, out);
    if (!diff.empty()) {
      const Gap gap = logprob_gap(out, trainer_logprobs(m, cs, out, Context{}, 1 << 20, 16, precision));
      report(vars[i], "differs from the baseline: " + diff +
                          "; vs trainer: " + std::to_string(gap.differing) + " of " +
                          std::to_string(gap.tokens) + " tokens differ (" + gap.first_bad + ")");
      return st;
    }
    ++st.runs;
  }
  return st;
}

}  // namespace lockstep::parity
