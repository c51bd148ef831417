// Tests of the model forward/backward: finite-difference gradients of the
// whole model (dense and MoE, router included), and the alignment property
// at model level: a token's logits are bit-identical whether its sequence is
// prefilled whole, in chunks, decoded token by token, or batched with others;
// and routing replay, with experts the router would not choose.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <numeric>
#include <set>

#include "common/test_util.h"
#include "lockstep/kernels/cpu/fp8_quant.h"
#include "lockstep/kernels/cpu/gemm.h"
#include "lockstep/model/forward.h"
#include "lockstep/model/weights.h"
#include "lockstep/model/params.h"

namespace lockstep::model {
namespace {

ModelConfig tiny_dense(bool qk_norm, bool qkv_bias) {
  ModelConfig c;
  c.architecture = qkv_bias ? Architecture::Qwen2 : (qk_norm ? Architecture::Qwen3 : Architecture::Llama);
  c.vocab_size = 48;
  c.hidden_size = 32;
  c.num_layers = 2;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 8;
  c.intermediate_size = 40;
  c.qk_norm = qk_norm;
  c.qkv_bias = qkv_bias;
  c.rope_theta = 10000.0;
  c.max_position_embeddings = 256;
  return c;
}

ModelConfig tiny_moe(bool deepseek_style) {
  ModelConfig c = tiny_dense(true, false);
  c.architecture = deepseek_style ? Architecture::Dots1 : Architecture::Qwen3Moe;
  c.num_experts = 4;
  c.num_experts_per_tok = 2;
  c.moe_intermediate_size = 16;
  c.norm_topk_prob = true;
  if (deepseek_style) {
    c.router_scoring = RouterScoring::Sigmoid;
    c.score_correction_bias = true;
    c.routed_scaling_factor = 2.5;
    c.n_shared_experts = 1;
    c.shared_expert_intermediate_size = 16;  // n_shared_experts * Fe, as dots.llm1 requires
    c.first_k_dense_replace = 1;
  } else {
    c.intermediate_size = 0;
  }
  return c;
}

struct Fixture {
  explicit Fixture(const ModelConfig& c, uint64_t seed = 7)
      : layout(c), buf(alloc_params(layout)), ctx{nullptr, 0} {
    init_params(layout, buf.as<float>(), seed, 0.2f);
    // Non-trivial norm weights and biases so their gradients are exercised.
    auto noise = test::randn(layout.numel(), 99, 0.05f);
    for (const auto& p : layout.params())
      if (p.kind != ParamKind::Matrix)
        for (int64_t j = 0; j < p.numel; ++j) buf.as<float>()[p.offset + j] += noise[size_t(p.offset + j)];
    weights = std::make_unique<ModelWeights>(ctx, layout, buf.as<float>());
  }
  ParamLayout layout;
  Buffer buf;
  Context ctx;
  std::unique_ptr<ModelWeights> weights;
};

// One sequence per entry, all tokens new, logits for every row.
RaggedBatch full_batch(const std::vector<std::vector<int32_t>>& seqs, int block_size, int max_blocks) {
  RaggedBatch b(max_blocks);
  std::vector<int32_t> blocks(static_cast<size_t>(max_blocks));
  for (size_t i = 0; i < seqs.size(); ++i) {
    std::iota(blocks.begin(), blocks.end(), int32_t(i) * max_blocks);
    b.add_sequence(seqs[i].data(), int32_t(seqs[i].size()), 0, blocks.data(), max_blocks);
  }
  (void)block_size;
  b.logit_rows.resize(b.tokens.size());
  std::iota(b.logit_rows.begin(), b.logit_rows.end(), 0);
  return b;
}

std::vector<int32_t> random_tokens(int n, int vocab, uint32_t seed) {
  std::mt19937 g(seed);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& x : t) x = int32_t(g() % uint32_t(vocab));
  return t;
}

void gradient_check(const ModelConfig& c) {
  Fixture f(c);
  auto b = full_batch({random_tokens(7, int(c.vocab_size), 1), random_tokens(5, int(c.vocab_size), 2)}, 4, 8);
  const int64_t R = int64_t(b.logit_rows.size());
  auto probe = test::randn(R * c.vocab_size, 3);

  KvCache kv(c, 64, 4);
  Workspace ws;
  ForwardResult r;
  Activations acts;
  ForwardOptions opt;
  opt.save_activations = true;
  opt.record_experts = true;
  forward(f.ctx, *f.weights, kv, ws, b, opt, &r, &acts);
  Buffer gbuf = alloc_params(f.layout);
  ModelParams grads = bind(f.layout, gbuf.as<float>());
  Tensor dlogits(probe.data(), DType::F32, {R, c.vocab_size});
  backward(f.ctx, *f.weights, kv, ws, b, acts, dlogits, grads);

  // Central differences on a spread of parameters of every tensor. The
  // tolerance is relative to the gradient's own size plus a small fraction of
  // the largest gradient anywhere (f32 round-off of the loss).
  double gmax = 0;
  for (int64_t i = 0; i < f.layout.numel(); ++i) gmax = std::max(gmax, double(std::fabs(gbuf.as<float>()[i])));
  std::mt19937 g(5);
  int checked = 0, skipped = 0;
  for (const auto& p : f.layout.params()) {
    for (int trial = 0; trial < 3; ++trial) {
      const int64_t j = p.offset + int64_t(g() % uint64_t(p.numel));
      float* w = f.buf.as<float>() + j;
      const float orig = *w;
      const float eps = 2e-3f * std::max(1.0f, std::fabs(orig));
      auto eval = [&](float v) {
        *w = v;
        f.weights->refresh(f.ctx, 0);
        KvCache kv2(c, 64, 4);
        ForwardResult r2;
        ForwardOptions o2;
        o2.record_experts = true;
        forward(f.ctx, *f.weights, kv2, ws, b, o2, &r2);
        double s = 0;
        for (int64_t i = 0; i < r2.logits.numel(); ++i) s += double(r2.logits.f32()[i]) * probe[size_t(i)];
        return std::make_pair(s, r2.routed_experts);
      };
      auto [lp, ep] = eval(orig + eps);
      auto [lm, em] = eval(orig - eps);
      *w = orig;
      f.weights->refresh(f.ctx, 0);
      if (ep != r.routed_experts || em != r.routed_experts) {  // top-k flipped: not differentiable here
        ++skipped;
        continue;
      }
      const double fd = (lp - lm) / (2.0 * double(eps));
      const double an = gbuf.as<float>()[j];
      EXPECT_NEAR(an, fd, 1e-2 * std::fabs(fd) + 2e-3 * gmax) << p.name << " element " << j - p.offset;
      ++checked;
    }
  }
  EXPECT_GT(checked, int(f.layout.params().size()));
  EXPECT_LE(skipped, checked / 4);
}

}  // namespace

TEST(ModelGrad, DenseLlama) { gradient_check(tiny_dense(false, false)); }
TEST(ModelGrad, DenseQwen3QkNorm) { gradient_check(tiny_dense(true, false)); }
TEST(ModelGrad, DenseQwen2Bias) { gradient_check(tiny_dense(false, true)); }
TEST(ModelGrad, MoeQwen3) { gradient_check(tiny_moe(false)); }
TEST(ModelGrad, MoeDeepSeekStyleSharedExpertsDenseFirstLayer) { gradient_check(tiny_moe(true)); }

// Logits of a sequence prefilled whole == chunked prefill == token-by-token
// decode == the same sequence inside a batch of others, bit for bit.
TEST(ModelAlignment, ChunkingDecodeAndBatchingGiveIdenticalBits) {
  for (const ModelConfig& c : {tiny_dense(true, false), tiny_moe(false), tiny_moe(true)}) {
    Fixture f(c);
    const int L = 23, V = int(c.vocab_size), BS = 4, MB = 8;
    auto seq = random_tokens(L, V, 11);
    auto whole = full_batch({seq}, BS, MB);
    KvCache kv(c, 64, BS);
    Workspace ws;
    ForwardResult ref;
    forward(f.ctx, *f.weights, kv, ws, whole, {}, &ref);

    for (int chunk : {1, 2, 3, 7, 16}) {
      for (int threads : {1, 2}) {
        ThreadPool pool(threads);
        Context ctx{&pool, 0};
        KvCache kv2(c, 64, BS);
        for (int start = 0; start < L; start += chunk) {
          const int n = std::min(chunk, L - start);
          RaggedBatch b(MB);
          std::vector<int32_t> scrambled(static_cast<size_t>(MB));  // physical blocks in reverse order
          for (int j = 0; j < MB; ++j) scrambled[size_t(j)] = MB - 1 - j;
          b.add_sequence(seq.data() + start, n, start, scrambled.data(), MB);
          for (int j = 0; j < n; ++j) b.logit_rows.push_back(j);
          ForwardResult r;
          forward(ctx, *f.weights, kv2, ws, b, {}, &r);
          test::expect_bits_equal(r.logits.f32(), ref.logits.f32() + int64_t(start) * V, int64_t(n) * V,
                                  "chunked logits");
        }
      }
    }
    // Inside a batch with two other sequences of different lengths.
    auto batch = full_batch({random_tokens(9, V, 12), seq, random_tokens(30, V, 13)}, BS, MB);
    KvCache kv3(c, 64, BS);
    ForwardResult rb;
    forward(f.ctx, *f.weights, kv3, ws, batch, {}, &rb);
    test::expect_bits_equal(rb.logits.f32() + 9 * V, ref.logits.f32(), int64_t(L) * V, "batched logits");
  }
}

TEST(ModelForward, RoutingReplayReproducesRecordedRouting) {
  ModelConfig c = tiny_moe(false);
  Fixture f(c);
  auto b = full_batch({random_tokens(10, int(c.vocab_size), 4)}, 4, 8);
  KvCache kv(c, 64, 4);
  Workspace ws;
  ForwardResult r1, r2;
  ForwardOptions o;
  o.record_experts = true;
  forward(f.ctx, *f.weights, kv, ws, b, o, &r1);
  o.replay_experts = &r1.routed_experts;
  KvCache kv2(c, 64, 4);
  forward(f.ctx, *f.weights, kv2, ws, b, o, &r2);
  EXPECT_EQ(r1.routed_experts, r2.routed_experts);
  test::expect_bits_equal(r1.logits.f32(), r2.logits.f32(), r1.logits.numel(), "replayed logits");
}

// Replayed experts that the router would not pick must be the ones used. The
// reference is the same Dots1 model with its score-correction bias raised on
// exactly those experts: the bias decides the selection only, never the gate
// weights, so that model's own routing is the replay, with the same weights.
TEST(ModelForward, RoutingReplayUsesTheReplayedExpertsNotTheRoutersChoice) {
  ModelConfig c = tiny_moe(true);
  c.num_layers = 3;  // layer 0 dense, layers 1 and 2 MoE
  const int64_t n_moe = 2, K = 2;
  Fixture f(c);
  // Per MoE layer, the replayed pair in the order the raised bias ranks them.
  const int32_t forced[2][2] = {{2, 3}, {3, 0}};
  Buffer forced_buf = alloc_params(f.layout);
  std::memcpy(forced_buf.data(), f.buf.data(), f.layout.nbytes());
  for (int m = 0; m < n_moe; ++m) {
    const ParamInfo& p =
        f.layout.at("model.layers." + std::to_string(m + 1) + ".mlp.gate.e_score_correction_bias");
    forced_buf.as<float>()[p.offset + forced[m][0]] += 100.0f;
    forced_buf.as<float>()[p.offset + forced[m][1]] += 50.0f;
  }
  ModelWeights forced_weights(f.ctx, f.layout, forced_buf.as<float>());

  auto b =
      full_batch({random_tokens(10, int(c.vocab_size), 4), random_tokens(7, int(c.vocab_size), 5)}, 4, 8);
  const int64_t T = int64_t(b.tokens.size());
  std::vector<int32_t> replay;  // (T, L_moe, K)
  for (int64_t t = 0; t < T; ++t)
    for (int m = 0; m < n_moe; ++m) replay.insert(replay.end(), forced[m], forced[m] + K);

  ForwardOptions rec;
  rec.record_experts = true;
  ForwardResult own, want, got;
  KvCache kv1(c, 64, 4), kv2(c, 64, 4), kv3(c, 64, 4);
  Workspace ws;
  forward(f.ctx, *f.weights, kv1, ws, b, rec, &own);
  forward(f.ctx, forced_weights, kv2, ws, b, rec, &want);
  ASSERT_EQ(want.routed_experts, replay) << "the raised bias should select the replayed experts";
  // The router's own sets differ from the replayed ones for most (token, layer).
  int64_t differ = 0;
  for (int64_t i = 0; i < T * n_moe; ++i) {
    std::set<int32_t> a(own.routed_experts.begin() + i * K, own.routed_experts.begin() + (i + 1) * K);
    differ += a != std::set<int32_t>(replay.begin() + i * K, replay.begin() + (i + 1) * K);
  }
  EXPECT_GT(differ, T * n_moe / 2) << "the replay should disagree with the router";

  ForwardOptions o = rec;
  o.replay_experts = &replay;
  forward(f.ctx, *f.weights, kv3, ws, b, o, &got);
  EXPECT_EQ(got.routed_experts, replay);
  test::expect_bits_equal(got.logits.f32(), want.logits.f32(), got.logits.numel(),
                          "replayed vs forced logits");
  int64_t changed = 0;
  for (int64_t i = 0; i < got.logits.numel(); ++i) changed += got.logits.f32()[i] != own.logits.f32()[i];
  EXPECT_GT(changed, got.logits.numel() / 2) << "replay should change the logits of an un-replayed forward";
}

// A snapshot (ModelWeights::SnapshotOf) reads the bits of the weights over
// its source, keeps them when the source changes afterwards, takes the new
// ones at refresh, and copies only the tensors read unpacked: for every
// family (tied embedding, biases, shared experts, score bias) and storage.
std::vector<float> logits_of(const Context& ctx, const ModelWeights& w, const ModelConfig& c) {
  auto b = full_batch({random_tokens(7, int(c.vocab_size), 1), random_tokens(5, int(c.vocab_size), 2)}, 4, 8);
  KvCache kv(c, 64, 4);
  Workspace ws;
  ForwardResult r;
  forward(ctx, w, kv, ws, b, {}, &r);
  return std::vector<float>(r.logits.f32(), r.logits.f32() + r.logits.numel());
}

TEST(ModelWeights, SnapshotKeepsItsVersionAndCopiesOnlyTheUnpackedTensors) {
  ModelConfig tied = tiny_dense(false, true);
  tied.tie_word_embeddings = true;
  for (const ModelConfig& c : {tied, tiny_dense(true, false), tiny_moe(false), tiny_moe(true)}) {
    for (DType storage : {DType::F32, DType::BF16, DType::FP8E4M3}) {
      Fixture f(c);
      const int64_t block = storage == DType::FP8E4M3 ? 16 : 0;
      ModelWeights snap(f.ctx, f.layout, ModelWeights::SnapshotOf{f.buf.as<float>(), 7}, storage, block);
      EXPECT_EQ(snap.version(), 7u);  // packed at construction: no refresh before the first use
      const std::vector<float> before =
          logits_of(f.ctx, ModelWeights(f.ctx, f.layout, f.buf.as<float>(), storage, block), c);
      const std::vector<float> got = logits_of(f.ctx, snap, c);
      test::expect_bits_equal(got.data(), before.data(), int64_t(got.size()), "snapshot logits");

      // The unpacked tensors: the embedding, norms and biases at most.
      size_t unpacked = size_t(c.vocab_size * c.hidden_size) * sizeof(float);
      for (const auto& p : f.layout.params())
        if (p.kind != ParamKind::Matrix) unpacked += size_t(p.numel) * sizeof(float);
      EXPECT_EQ(snap.snapshot_bytes(), unpacked);
      EXPECT_EQ(ModelWeights(f.ctx, f.layout, f.buf.as<float>()).snapshot_bytes(), 0u);

      // The owner writes the next version: the snapshot still gives the old bits.
      auto noise = test::randn(f.layout.numel(), 5, 0.05f);
      for (int64_t i = 0; i < f.layout.numel(); ++i) f.buf.as<float>()[i] += noise[size_t(i)];
      const std::vector<float> kept = logits_of(f.ctx, snap, c);
      test::expect_bits_equal(kept.data(), before.data(), int64_t(kept.size()), "snapshot after a write");
      snap.refresh(f.ctx, 2);
      const std::vector<float> after =
          logits_of(f.ctx, ModelWeights(f.ctx, f.layout, f.buf.as<float>(), storage, block), c);
      const std::vector<float> fresh = logits_of(f.ctx, snap, c);
      test::expect_bits_equal(fresh.data(), after.data(), int64_t(fresh.size()), "snapshot after refresh");
      EXPECT_NE(std::memcmp(after.data(), before.data(), after.size() * sizeof(float)), 0);
      EXPECT_EQ(snap.version(), 2u);
    }
  }
}

// With fp8 weights the forward quantizes each projection's input per token
// and per 128 channels (power-of-two scales) before the GEMM: attn_out is
// quantize(attn) · Woᵀ, not attn · Woᵀ. Both engines share this function, so
// this is where fp8 activations enter the aligned forward.
TEST(ModelForward, Fp8WeightsQuantizeTheProjectionInputs) {
  ModelConfig c = tiny_moe(false);
  c.hidden_size = 160;  // more than one 128-channel group per row
  c.num_heads = 4;
  c.head_dim = 40;
  Fixture f(c);
  ModelWeights fp8(f.ctx, f.layout, f.buf.as<float>(), DType::FP8E4M3, 32);
  auto b = full_batch({random_tokens(6, int(c.vocab_size), 4), random_tokens(3, int(c.vocab_size), 5)}, 4, 8);
  std::vector<float> attn, attn_out;
  CaptureFn grab = [&](const Captured& x) {
    const std::string name = x.name;
    if (x.layer != 0 || (name != "attn" && name != "attn_out")) return;
    const float* d = x.data.f32();
    (name == "attn" ? attn : attn_out).assign(d, d + x.rows() * x.cols());
  };
  ForwardOptions o;
  o.capture = &grab;
  ForwardResult r;
  KvCache kv(c, 64, 4);
  Workspace ws;
  forward(f.ctx, fp8, kv, ws, b, o, &r);
  const int64_t T = int64_t(b.tokens.size()), HD = c.num_heads * c.head_dim, D = c.hidden_size;
  ASSERT_EQ(int64_t(attn.size()), T * HD);
  ASSERT_EQ(int64_t(attn_out.size()), T * D);
  std::vector<float> q = attn, want(size_t(T * D)), plain(size_t(T * D));
  kernels::fp8_quantize_rows(f.ctx, Tensor(q.data(), DType::F32, {T, HD}), 128);
  kernels::gemm_xwt(f.ctx, Tensor(want.data(), DType::F32, {T, D}), Tensor(q.data(), DType::F32, {T, HD}),
                    fp8.layer(0).wo);
  kernels::gemm_xwt(f.ctx, Tensor(plain.data(), DType::F32, {T, D}), Tensor(attn.data(), DType::F32, {T, HD}),
                    fp8.layer(0).wo);
  test::expect_bits_equal(attn_out.data(), want.data(), T * D, "attn_out = quantize(attn) · Woᵀ");
  int64_t differ = 0;
  for (int64_t i = 0; i < T * D; ++i) differ += plain[size_t(i)] != want[size_t(i)];
  EXPECT_GT(differ, 0) << "quantizing attn should change o_proj's output";
}

// Backward through an fp8 forward: a projection's weight gradient is taken
// against its input quantized as the forward quantized it (the product the
// forward computed), here the vocabulary projection: d lm_head = dlogitsᵀ ·
// quantize(final_norm rows), bit for bit, and not dlogitsᵀ · final_norm.
TEST(ModelBackward, Fp8WeightGradientsUseTheQuantizedInputs) {
  ModelConfig c = tiny_moe(false);
  c.hidden_size = 160;  // more than one 128-channel group per row
  c.num_heads = 4;
  c.head_dim = 40;
  Fixture f(c);
  ModelWeights fp8(f.ctx, f.layout, f.buf.as<float>(), DType::FP8E4M3, 32, {}, true);
  auto b = full_batch({random_tokens(6, int(c.vocab_size), 4), random_tokens(3, int(c.vocab_size), 5)}, 4, 8);
  const int64_t R = int64_t(b.logit_rows.size()), D = c.hidden_size, V = c.vocab_size;
  std::vector<float> rows;
  CaptureFn grab = [&](const Captured& x) {
    if (std::string(x.name) == "final_norm") rows.assign(x.data.f32(), x.data.f32() + x.rows() * x.cols());
  };
  ForwardOptions o;
  o.capture = &grab;
  o.save_activations = true;
  ForwardResult r;
  Activations acts;
  KvCache kv(c, 64, 4);
  Workspace ws;
  forward(f.ctx, fp8, kv, ws, b, o, &r, &acts);
  ASSERT_EQ(int64_t(rows.size()), R * D);
  auto probe = test::randn(R * V, 7);
  Buffer gbuf = alloc_params(f.layout);
  ModelParams grads = bind(f.layout, gbuf.as<float>());
  backward(f.ctx, fp8, kv, ws, b, acts, Tensor(probe.data(), DType::F32, {R, V}), grads);

  std::vector<float> q = rows, want(size_t(V * D), 0.0f), plain(size_t(V * D), 0.0f);
  kernels::fp8_quantize_rows(f.ctx, Tensor(q.data(), DType::F32, {R, D}), 128);
  const Tensor dlogits(probe.data(), DType::F32, {R, V});
  kernels::gemm_dytx(f.ctx, Tensor(want.data(), DType::F32, {V, D}), dlogits, Tensor(q.data(), DType::F32, {R, D}));
  kernels::gemm_dytx(f.ctx, Tensor(plain.data(), DType::F32, {V, D}), dlogits,
                     Tensor(rows.data(), DType::F32, {R, D}));
  test::expect_bits_equal(grads.lm_head.f32(), want.data(), V * D, "d lm_head = dlogitsᵀ · quantize(rows)");
  int64_t differ = 0;
  for (int64_t i = 0; i < V * D; ++i) differ += plain[size_t(i)] != want[size_t(i)];
  EXPECT_GT(differ, 0) << "quantizing the rows should change the weight gradient";
}

TEST(ModelForward, AddSequenceBuildsTheRaggedBatch) {
  RaggedBatch b(3);
  const std::vector<int32_t> t1 = {5, 6, 7}, t2 = {8}, k1 = {4, 2}, k2 = {1, 0, 3};
  EXPECT_EQ(b.add_sequence(t1.data(), 3, 0, k1.data(), 2), 0);
  EXPECT_EQ(b.add_sequence(t2.data(), 1, 9, k2.data(), 3), 3);
  EXPECT_EQ(b.tokens, (std::vector<int32_t>{5, 6, 7, 8}));
  EXPECT_EQ(b.n_ctx, (std::vector<int32_t>{0, 9}));
  EXPECT_EQ(b.n_new, (std::vector<int32_t>{3, 1}));
  EXPECT_EQ(b.block_table, (std::vector<int32_t>{4, 2, 0, 1, 0, 3}));  // short rows padded with block 0
  EXPECT_EQ(b.num_seqs(), 2);
  EXPECT_THROW(b.add_sequence(t2.data(), 1, 0, k2.data(), 4), Error);  // more blocks than a row holds
  RaggedBatch unsized;
  EXPECT_THROW(unsized.add_sequence(t2.data(), 1, 0, k2.data(), 1), Error);  // max_blocks not set
}

TEST(ModelForward, BadBatchesAreRejectedWithAMessage) {
  ModelConfig c = tiny_dense(false, false);
  Fixture f(c);
  KvCache kv(c, 8, 4);
  Workspace ws;
  ForwardResult r;
  auto b = full_batch({random_tokens(5, int(c.vocab_size), 4)}, 4, 1);  // 5 tokens, 4 slots
  EXPECT_THROW(forward(f.ctx, *f.weights, kv, ws, b, {}, &r), Error);
  auto b2 = full_batch({{1, 2, 999}}, 4, 2);
  try {
    forward(f.ctx, *f.weights, kv, ws, b2, {}, &r);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("999"), std::string::npos) << e.what();
  }
}

}  // namespace lockstep::model
