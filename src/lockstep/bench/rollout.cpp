// The rollout-engine benchmark of rollout.h: engines driven step by step on
// random prompts (decode, prefill, GRPO-shaped), the GEMM-only time of a
// decode step, and the two tables.
#include "lockstep/bench/rollout.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "lockstep/base/thread_pool.h"
#include "lockstep/base/timer.h"
#include "lockstep/kernels/cpu/gemm.h"
#include "lockstep/rollout/engine.h"

namespace lockstep::perf {
namespace {

std::vector<int32_t> random_prompt(int64_t n, int64_t vocab, std::mt19937& g) {
  std::vector<int32_t> p(static_cast<size_t>(n));
  for (auto& t : p) t = int32_t(g() % uint32_t(vocab));
  return p;
}

rollout::Request make_request(std::vector<int32_t> prompt, int64_t n, int64_t max_new, int64_t seed) {
  rollout::Request r;
  r.prompt_ids = std::move(prompt);
  r.params.temperature = 1.0f;
  r.params.n = n;
  r.params.max_new_tokens = max_new;
  r.params.ignore_eos = true;  // fixed lengths: every sample generates max_new tokens
  r.params.seed = seed;
  return r;
}

int64_t blocks_needed(int64_t seqs, int64_t tokens, int bs) {
  return seqs * ((tokens + bs - 1) / bs + 1) + 16;
}

// Runs the engine step by step until idle. Returns the time of all steps and,
// in *decode_s / *decode_tokens, of the steps that were pure decodes (every
// token fed produced a token).
RunResult drive(rollout::Engine& e, double* decode_s = nullptr, int64_t* decode_tokens = nullptr,
                int64_t* decode_steps = nullptr, double* decode_cpu_s = nullptr) {
  RunResult r;
  rollout::EngineStats before = e.stats();
  const rollout::EngineStats start = before;
  for (;;) {
    Timer t;
    const double c0 = process_cpu_seconds();
    const bool busy = e.step();
    const double dt = t.seconds(), dc = process_cpu_seconds() - c0;
    const rollout::EngineStats now = e.stats();
    r.seconds += dt;
    const int64_t fed = now.prompt_tokens - before.prompt_tokens,
                  gen = now.generated_tokens - before.generated_tokens;
    if (decode_s && fed > 0 && fed == gen) {
      *decode_s += dt;
      *decode_tokens += gen;
      ++*decode_steps;
      *decode_cpu_s += dc;
    }
    before = now;
    if (!busy) break;
  }
  r.generated = before.generated_tokens - start.generated_tokens;
  r.fed = before.prompt_tokens - start.prompt_tokens;
  return r;
}

// Seconds per decode step of `batch` sequences for the step's GEMMs alone:
// every layer's qkv, o, router and expert products (the batch's B*K expert
// rows spread evenly over the E experts, as a random router spreads them) and
// lm_head, with the engine's packed weights and thread pool.
double gemm_step_seconds(const Context& ctx, const model::ModelWeights& w, int64_t batch, double seconds) {
  namespace k = lockstep::kernels;
  const ModelConfig& c = w.config();
  const int64_t B = batch, D = c.hidden_size, QKV = (c.num_heads + 2 * c.num_kv_heads) * c.head_dim;
  const int64_t E = c.num_experts, K = c.num_experts_per_tok;
  std::vector<float> x(size_t(std::max<int64_t>(B * std::max<int64_t>(K, 1), 1) *
                              std::max({D, QKV, c.q_dim(), 2 * c.moe_intermediate_size,
                                        2 * c.intermediate_size, 2 * c.shared_expert_intermediate_size})),
                       0.01f);
  std::vector<float> y(x.size() + size_t(B * c.vocab_size));
  auto gemm = [&](int64_t rows, const k::PackedWeight& pw) {
    if (rows == 0) return;
    k::gemm_xwt(ctx, Tensor(y.data(), DType::F32, {rows, pw.n}), Tensor(x.data(), DType::F32, {rows, pw.k}),
                pw);
  };
  auto mlp = [&](int64_t rows, const model::PackedMlp& m) {
    gemm(rows, m.gate_up);
    gemm(rows, m.down);
  };
  auto one_step = [&] {
    for (int64_t l = 0; l < c.num_layers; ++l) {
      const model::PackedLayer& pl = w.layer(l);
      gemm(B, pl.wqkv);
      gemm(B, pl.wo);
      if (c.is_moe_layer(l)) {
        gemm(B, pl.router);
        for (int64_t e = 0; e < E; ++e) mlp(B * K * (e + 1) / E - B * K * e / E, pl.experts[size_t(e)]);
        if (c.has_shared_expert()) mlp(B, pl.shared);
      } else {
        mlp(B, pl.mlp);
      }
    }
    gemm(B, w.lm_head());
  };
  one_step();  // warm
  int64_t n = 0;
  Timer t;
  do {
    one_step();
    ++n;
  } while (t.seconds() < seconds);
  return t.seconds() / double(n);
}

double weight_bytes(const kernels::PackedWeight& pw) {
  return double(pw.data.size()) + double(pw.panel_scales.size());
}

double mlp_bytes(const model::PackedMlp& m) {
  return weight_bytes(m.gate_up) + weight_bytes(m.down);
}

}  // namespace

double decode_step_bytes(const model::ModelWeights& w, int64_t batch, int64_t ctx_len, int64_t kv_bytes) {
  const ModelConfig& c = w.config();
  const double E = double(c.num_experts), K = double(c.num_experts_per_tok);
  const double distinct = E > 0 ? E * (1.0 - std::pow(1.0 - K / E, double(batch))) : 0.0;
  double bytes = weight_bytes(w.lm_head());
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const model::PackedLayer& pl = w.layer(l);
    bytes += weight_bytes(pl.wqkv) + weight_bytes(pl.wo);
    if (!c.is_moe_layer(l)) {
      bytes += mlp_bytes(pl.mlp);
      continue;
    }
    bytes += weight_bytes(pl.router) + mlp_bytes(pl.shared);
    double experts = 0;
    for (const model::PackedMlp& m : pl.experts) experts += mlp_bytes(m);
    if (!pl.experts.empty()) bytes += experts / double(pl.experts.size()) * distinct;
  }
  // Keys and values: DeepSeek-V4 keeps one shared K = V head per token.
  const int64_t per_token = c.is_v4() ? c.head_dim : 2 * c.num_kv_heads * c.head_dim;
  bytes += double(batch) * double(ctx_len) * double(c.num_layers) * double(per_token) * double(kv_bytes);
  return bytes;
}

DecodeResult run_decode(const Context& ctx, const model::ModelWeights& w, const RolloutBenchOptions& opt,
                        int64_t batch, double copy_gb_per_s, double peak_gflops) {
  const ModelConfig& c = w.config();
  rollout::EngineConfig ec;
  ec.bf16_kv = opt.bf16_kv;
  ec.block_size = 16;
  ec.num_blocks = blocks_needed(batch, opt.decode_prompt_len + opt.new_tokens, ec.block_size);
  ec.max_running = batch;
  ec.max_batch_tokens = std::max<int64_t>(2048, batch * opt.decode_prompt_len);
  ec.prefix_cache = false;
  rollout::Engine e(ctx, &w, ec);
  std::mt19937 g{static_cast<uint32_t>(batch)};
  for (int64_t i = 0; i < batch; ++i)
    e.submit(make_request(random_prompt(opt.decode_prompt_len, c.vocab_size, g), 1, opt.new_tokens, i));
  double ds = 0, dc = 0;
  int64_t dt = 0, steps = 0;
  drive(e, &ds, &dt, &steps, &dc);
  DecodeResult r;
  r.batch = batch;
  r.tokens_per_s = double(dt) / ds;
  r.cpu_use = dc / (ds * ctx.threads());
  r.step_ms = 1e3 * ds / double(std::max<int64_t>(steps, 1));
  r.gemm_step_ms = 1e3 * gemm_step_seconds(ctx, w, batch, opt.roofline_seconds);
  // Mean context of a decode step: the prompt plus half the generated tokens.
  const int64_t ctx_len = opt.decode_prompt_len + opt.new_tokens / 2;
  r.step_bytes = decode_step_bytes(w, batch, ctx_len, opt.bf16_kv ? 2 : 4);
  r.memory_step_ms = copy_gb_per_s > 0 ? 1e3 * r.step_bytes / (copy_gb_per_s * 1e9) : 0.0;
  const double step_flops = double(batch) * forward_flops_per_token(c, ctx_len);
  r.compute_step_ms = peak_gflops > 0 ? 1e3 * step_flops / (peak_gflops * 1e9) : 0.0;
  const double bound_ms = std::max(r.compute_step_ms, r.memory_step_ms);
  r.roofline_tokens_per_s = double(batch) / ((bound_ms > 0 ? bound_ms : r.gemm_step_ms) * 1e-3);
  r.gflops = r.tokens_per_s * forward_flops_per_token(c, ctx_len) * 1e-9;
  return r;
}

double run_prefill(const Context& ctx, const model::ModelWeights& w, const RolloutBenchOptions& opt) {
  const ModelConfig& c = w.config();
  rollout::EngineConfig ec;
  ec.bf16_kv = opt.bf16_kv;
  ec.block_size = 16;
  ec.num_blocks = blocks_needed(opt.prefill_prompts, opt.prefill_len + 1, ec.block_size);
  ec.max_running = opt.prefill_prompts;
  ec.prefix_cache = false;
  rollout::Engine e(ctx, &w, ec);
  std::mt19937 g(99);
  for (int64_t i = 0; i < opt.prefill_prompts; ++i)
    e.submit(make_request(random_prompt(opt.prefill_len, c.vocab_size, g), 1, 1, i));
  const RunResult r = drive(e);
  return double(opt.prefill_prompts * opt.prefill_len) / r.seconds;
}

RunResult run_grpo(const Context& ctx, const model::ModelWeights& w, const RolloutBenchOptions& opt,
                   bool shared) {
  const ModelConfig& c = w.config();
  const int64_t samples = opt.grpo_prompts * opt.grpo_samples;
  rollout::EngineConfig ec;
  ec.bf16_kv = opt.bf16_kv;
  ec.block_size = 16;
  ec.num_blocks = blocks_needed(samples, opt.grpo_prompt_len + opt.new_tokens, ec.block_size);
  ec.max_running = samples;
  ec.max_batch_tokens = 4096;
  ec.prefix_cache = shared;
  rollout::Engine e(ctx, &w, ec);
  std::mt19937 g(5);
  for (int64_t i = 0; i < opt.grpo_prompts; ++i) {
    auto p = random_prompt(opt.grpo_prompt_len, c.vocab_size, g);
    if (shared) {
      e.submit(make_request(p, opt.grpo_samples, opt.new_tokens, i));
    } else {
      for (int64_t s = 0; s < opt.grpo_samples; ++s)
        e.submit(make_request(p, 1, opt.new_tokens, i * opt.grpo_samples + s));
    }
  }
  return drive(e);
}

RolloutBenchResult run_rollout_bench(const RolloutBenchOptions& opt, Peak peak) {
  RolloutBenchResult r;
  r.model = model_name(opt.config_path);
  r.opt = opt;
  const ModelConfig c = model_config_from_toml_file(opt.config_path);
  ThreadPool pool(opt.threads);
  Context ctx{&pool, 0};
  ctx.gpu = opt.gpu;
  r.peak = peak.wall_gflops > 0 ? peak : measure_fma_peak(opt.threads);
  ParamLayout layout(c);
  Buffer params = bench_params(layout, ctx);
  model::ModelWeights w(ctx, layout, params.as<float>(), opt.precision, opt.fp8_block);
  // Read at the rate a pass over the whole model's packed weights reads: the
  // decode loop cycles through them step after step.
  r.copy_gb_per_s = measure_read_bandwidth(ctx, size_t(decode_step_bytes(w, int64_t(1) << 30, 0, 0)));
  for (int64_t b : opt.decode_batches)
    r.decode.push_back(run_decode(ctx, w, opt, b, r.copy_gb_per_s, r.peak.gflops()));
  r.prefill_tokens_per_s = run_prefill(ctx, w, opt);
  // The engine projects only the row it samples from onto the vocabulary:
  // lm_head once per prompt, not once per prompt token (counting it per
  // token put a one-layer model with a 151,936-entry head at 141% of peak).
  const double head = 2.0 * double(c.hidden_size) * double(c.vocab_size);
  const double n = double(opt.prefill_len);
  r.prefill_gflops =
      r.prefill_tokens_per_s * (forward_flops_per_token(c, opt.prefill_len) - head + head / n) * 1e-9;
  r.grpo_shared = run_grpo(ctx, w, opt, true);
  r.grpo_unshared = run_grpo(ctx, w, opt, false);
  return r;
}

std::string precision_name(DType p) {
  return p == DType::F32 ? "f32" : p == DType::BF16 ? "bf16" : "fp8";
}

std::string rollout_tables(const std::vector<RolloutBenchResult>& rs) {
  Table d({"model", "precision", "threads", "batch", "decode tok/s", "step ms", "GEMM-only ms", "compute ms",
           "memory ms", "roofline tok/s", "% of roofline", "GFLOP/s", "% of peak", "CPU use"});
  Table o({"model", "precision", "threads", "workload", "tokens fed", "tokens generated", "seconds", "tok/s",
           "note"});
  for (const auto& r : rs) {
    for (const auto& x : r.decode)
      d.add({r.model, precision_name(r.opt.precision), fmt("%d", r.opt.threads),
             fmt("%lld", (long long)x.batch), fmt("%.0f", x.tokens_per_s), fmt("%.2f", x.step_ms),
             fmt("%.2f", x.gemm_step_ms), fmt("%.2f", x.compute_step_ms), fmt("%.2f", x.memory_step_ms),
             fmt("%.0f", x.roofline_tokens_per_s),
             fmt("%.1f%%", 100.0 * x.tokens_per_s / x.roofline_tokens_per_s), fmt("%.1f", x.gflops),
             fmt("%.1f%%", 100.0 * x.gflops / r.peak.gflops()), fmt("%.0f%%", 100.0 * x.cpu_use)});
    const int64_t pt = r.opt.prefill_prompts * r.opt.prefill_len;
    o.add({r.model, precision_name(r.opt.precision), fmt("%d", r.opt.threads),
           fmt("prefill %lldx%lld", (long long)r.opt.prefill_prompts, (long long)r.opt.prefill_len),
           fmt("%lld", (long long)pt), fmt("%lld", (long long)r.opt.prefill_prompts),
           fmt("%.2f", double(pt) / r.prefill_tokens_per_s), fmt("%.0f", r.prefill_tokens_per_s),
           fmt("prompt tok/s; %.1f GFLOP/s, %.1f%% of peak", r.prefill_gflops,
               100.0 * r.prefill_gflops / r.peak.gflops())});
    for (int shared = 1; shared >= 0; --shared) {
      const RunResult& g = shared ? r.grpo_shared : r.grpo_unshared;
      o.add({r.model, precision_name(r.opt.precision), fmt("%d", r.opt.threads),
             fmt("grpo %lldx%lld %s", (long long)r.opt.grpo_prompts, (long long)r.opt.grpo_samples,
                 shared ? "shared" : "unshared"),
             fmt("%lld", (long long)g.fed), fmt("%lld", (long long)g.generated), fmt("%.2f", g.seconds),
             fmt("%.0f", g.tokens_per_s()),
             shared ? std::string("generated tok/s, prompt prefilled once per group")
                    : fmt("generated tok/s; shared is %.2fx faster",
                          r.grpo_unshared.seconds / r.grpo_shared.seconds)});
    }
  }
  std::string out = d.str() + "\n" + o.str();
  for (const auto& r : rs)
    out += fmt("%s: peak ", r.model.c_str()) + fmt("%.1f GFLOP/s", r.peak.gflops()) +
           fmt("; read bandwidth %.1f GB/s over a buffer of its weights' size (memory ms: the step's weight "
               "and KV bytes at it)",
               r.copy_gb_per_s) +
           "\n";
  return out;
}

}  // namespace lockstep::perf
