// LoRA adapters in the engines: the [lora] section, the views over the PEFT
// layout (peft.h, tested in peft_test), the adapter product against a double-precision reference, its
// backward (dA, dB, dx) by finite differences in double, whole-model gradients of the adapters over a frozen
// base (dense and MoE), and the alignment property with adapters on: decode, chunked prefill and batching
// give the full prefill's logits bit for bit at f32, bf16 and fp8 base storage.
#include "lockstep/model/lora.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <tuple>

#include "common/test_util.h"
#include "common/v4_config.h"
#include "lockstep/model/forward.h"
#include "lockstep/model/params.h"
#include "lockstep/model/weights.h"
#include "model/model_test_util.h"

namespace lockstep::model {
namespace {

ModelConfig dense_config() {
  ModelConfig c;
  c.architecture = Architecture::Qwen3;
  c.vocab_size = 48;
  c.hidden_size = 32;
  c.num_layers = 2;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 8;
  c.intermediate_size = 40;
  c.qk_norm = true;
  c.max_position_embeddings = 256;
  return c;
}

// dots.llm1-style MoE: a dense first layer, routed experts and a shared expert.
ModelConfig moe_config() {
  ModelConfig c = dense_config();
  c.architecture = Architecture::Dots1;
  c.num_experts = 4;
  c.num_experts_per_tok = 2;
  c.moe_intermediate_size = 16;
  c.norm_topk_prob = true;
  c.router_scoring = RouterScoring::Sigmoid;
  c.score_correction_bias = true;
  c.routed_scaling_factor = 2.5;
  c.n_shared_experts = 1;
  c.shared_expert_intermediate_size = 16;
  c.first_k_dense_replace = 1;
  return c;
}

ModelConfig qwen3_moe_config() {
  ModelConfig c = dense_config();
  c.architecture = Architecture::Qwen3Moe;
  c.intermediate_size = 0;
  c.num_experts = 4;
  c.num_experts_per_tok = 2;
  c.moe_intermediate_size = 16;
  c.norm_topk_prob = true;
  return c;
}

LoraConfig all_linear(int64_t rank = 4, double alpha = 8) {
  LoraConfig lc;
  lc.rank = rank;
  lc.alpha = alpha;
  lc.target_modules = {"all-linear"};
  lc.init_seed = 3;
  return lc;
}

// A model with adapters: base and adapters random (B non-zero, so the
// adapters change the output).
struct LoraModel {
  LoraModel(const ModelConfig& c, const LoraConfig& lc, DType storage = DType::F32, bool effective = false)
      : layout(c),
        buf(alloc_params(layout)),
        lora_layout(layout, lc.spec()),
        lora_buf(size_t(lora_layout.numel()) * 4) {
    init_params(layout, buf.as<float>(), 7, 0.2f);
    lockstep::init_lora(lora_layout, lora_buf.as<float>(), lc.init_seed);
    auto noise = test::randn(lora_layout.numel(), 17, 0.2f);
    for (const auto& p : lora_layout.projections())
      for (int64_t j = 0; j < p.out_features * lc.rank; ++j)
        lora_buf.as<float>()[p.b_offset + j] = noise[size_t(p.b_offset + j)];
    lora = std::make_unique<LoraWeights>(lora_layout, lora_buf.as<float>());
    weights =
        std::make_unique<ModelWeights>(ctx, layout, buf.as<float>(), storage, 0, ExpertShard{}, effective);
    weights->set_lora(lora.get());
  }
  ParamLayout layout;
  Buffer buf;
  LoraLayout lora_layout;
  Buffer lora_buf;
  Context ctx{nullptr, 0};
  std::unique_ptr<LoraWeights> lora;
  std::unique_ptr<ModelWeights> weights;
};

RaggedBatch full_batch(const std::vector<std::vector<int32_t>>& seqs, int max_blocks) {
  RaggedBatch b(max_blocks);
  std::vector<int32_t> blocks(static_cast<size_t>(max_blocks));
  for (size_t i = 0; i < seqs.size(); ++i) {
    std::iota(blocks.begin(), blocks.end(), int32_t(i) * max_blocks);
    b.add_sequence(seqs[i].data(), int32_t(seqs[i].size()), 0, blocks.data(), max_blocks);
  }
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

// bind_lora puts every projection of the PEFT layout where forward looks
// for it: q/k/v/o per layer, the dense MLP, each routed expert, the shared one.
TEST(LoraBind, ViewsLandOnTheirProjections) {
  const ParamLayout base(moe_config());
  const LoraLayout all(base, all_linear(4).spec());
  std::vector<float> buf(size_t(all.numel()));
  const LoraParams p = bind_lora(all, buf.data());
  ASSERT_EQ(p.layers.size(), 2u);
  for (const LoraProjection& pr : all.projections()) {
    const LoraLayer& L = p.layers[size_t(pr.layer)];
    const LoraMlp& mlp = pr.expert >= 0 ? L.experts[size_t(pr.expert)]
                         : pr.base_name.find("shared_expert") != std::string::npos ? L.shared
                                                                                   : L.mlp;
    const LoraPair& got = pr.module == "q_proj"      ? L.q
                          : pr.module == "k_proj"    ? L.k
                          : pr.module == "v_proj"    ? L.v
                          : pr.module == "o_proj"    ? L.o
                          : pr.module == "gate_proj" ? mlp.gate
                          : pr.module == "up_proj"   ? mlp.up
                                                     : mlp.down;
    EXPECT_EQ(got.a.data, buf.data() + pr.a_offset) << pr.a_name;
    EXPECT_EQ(got.b.data, buf.data() + pr.b_offset) << pr.b_name;
    EXPECT_EQ(got.a.dim(0), 4);
    EXPECT_EQ(got.a.dim(1), pr.in_features);
    EXPECT_EQ(got.b.dim(0), pr.out_features);
  }
  EXPECT_FALSE(p.layers[0].experts[0].gate.on());  // layer 0 is dense
  EXPECT_TRUE(p.layers[0].mlp.gate.on());
  EXPECT_TRUE(p.layers[1].experts[3].down.on());
  EXPECT_TRUE(p.layers[1].shared.up.on());
  LoraConfig qv = all_linear(2);
  qv.target_modules = {"v_proj", "q_proj"};
  const LoraLayout l2(base, qv.spec());
  const LoraParams p2 = bind_lora(l2, buf.data());
  EXPECT_TRUE(p2.layers[1].q.on());
  EXPECT_FALSE(p2.layers[1].o.on());
  EXPECT_EQ(lora_expert(&p2.layers[1], 0), nullptr);
}

TEST(LoraConfig, ReadsTheSectionAndRefusesDropoutAndUnknownModules) {
  auto parse = [](const std::string& text) {
    toml::table root = toml::parse(text);
    TomlSection s(root["lora"].as_table(), "x.toml", "lora");
    LoraConfig c = lora_config_from_toml(s);
    s.finish();
    return c;
  };
  const LoraConfig c = parse("[lora]\nrank = 8\nalpha = 32\ntarget_modules = [\"q_proj\", \"down_proj\"]\n");
  EXPECT_EQ(c.rank, 8);
  EXPECT_FLOAT_EQ(c.scale(), 4.0f);
  EXPECT_EQ(c.modules(), (std::vector<std::string>{"q_proj", "down_proj"}));
  EXPECT_FALSE(parse("").enabled());
  EXPECT_EQ(parse("[lora]\nrank = 2\ntarget_modules = [\"all-linear\"]\n").modules().size(), 7u);
  test::expect_error([&] { parse("[lora]\nrank = 8\ndropout = 0.1\n"); }, {"x.toml", "dropout", "rollout"});
  test::expect_error([&] { parse("[lora]\nrank = 8\ntarget_modules = [\"qproj\"]\n"); },
                     {"target_modules", "qproj"});
  test::expect_error([&] { parse("[lora]\nrank = 8\nbias = \"none\"\n"); }, {"bias"});
}

// y = y0 + s·(x·Aᵀ)·Bᵀ in double, against lora_forward on a column block.
TEST(LoraKernel, ForwardMatchesADoubleReference) {
  const int64_t T = 5, in = 24, out = 40, r = 3;
  const float s = 1.75f;
  auto xv = test::randn(T * in, 1), av = test::randn(r * in, 2), bv = test::randn(out * r, 3);
  auto y0 = test::randn(T * (out + 8), 4);
  std::vector<float> y = y0;
  LoraPair p{Tensor(av.data(), DType::F32, {r, in}), Tensor(bv.data(), DType::F32, {out, r})};
  const Tensor x(xv.data(), DType::F32, {T, in});
  const Tensor full(y.data(), DType::F32, {T, out + 8});
  lora_forward(Context{nullptr, 0}, full.slice_cols(8, 8 + out), x, p, s);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t c = 0; c < 8; ++c) EXPECT_EQ(y[size_t(t * (out + 8) + c)], y0[size_t(t * (out + 8) + c)]);
    for (int64_t o = 0; o < out; ++o) {
      double acc = 0;
      for (int64_t j = 0; j < r; ++j) {
        double u = 0;
        for (int64_t i = 0; i < in; ++i) u += double(xv[size_t(t * in + i)]) * av[size_t(j * in + i)];
        acc += s * u * bv[size_t(o * r + j)];
      }
      const size_t at = size_t(t * (out + 8) + 8 + o);
      EXPECT_NEAR(y[at], y0[at] + acc, 1e-5 * (1 + std::fabs(acc)));
    }
  }
}

// L = <probe, y(x, A, B)>: lora_backward's dx, dA, dB against central
// differences of the double-precision function.
TEST(LoraKernel, BackwardMatchesFiniteDifferences) {
  const int64_t T = 4, in = 12, out = 10, r = 3;
  const double s = 0.5;
  auto xv = test::randn(T * in, 11), av = test::randn(r * in, 12), bv = test::randn(out * r, 13);
  auto probe = test::randn(T * out, 14);
  auto loss = [&](const std::vector<double>& x, const std::vector<double>& a, const std::vector<double>& b) {
    double l = 0;
    for (int64_t t = 0; t < T; ++t)
      for (int64_t o = 0; o < out; ++o) {
        double acc = 0;
        for (int64_t j = 0; j < r; ++j) {
          double u = 0;
          for (int64_t i = 0; i < in; ++i) u += x[size_t(t * in + i)] * a[size_t(j * in + i)];
          acc += s * u * b[size_t(o * r + j)];
        }
        l += acc * probe[size_t(t * out + o)];
      }
    return l;
  };
  std::vector<float> dx(size_t(T * in), 0.25f), da(size_t(r * in)), db(size_t(out * r));
  const std::vector<float> dx0 = dx;
  LoraPair p{Tensor(av.data(), DType::F32, {r, in}), Tensor(bv.data(), DType::F32, {out, r})};
  LoraPair g{Tensor(da.data(), DType::F32, {r, in}), Tensor(db.data(), DType::F32, {out, r})};
  lora_backward(Context{nullptr, 0}, Tensor(dx.data(), DType::F32, {T, in}),
                Tensor(probe.data(), DType::F32, {T, out}), Tensor(xv.data(), DType::F32, {T, in}), p, g,
                float(s));
  std::vector<double> x(xv.begin(), xv.end()), a(av.begin(), av.end()), b(bv.begin(), bv.end());
  auto check = [&](std::vector<double>& v, const std::vector<float>& grad, const std::vector<float>* base,
                   const char* what) {
    for (size_t i = 0; i < v.size(); ++i) {
      const double h = 1e-4, orig = v[i];
      v[i] = orig + h;
      const double lp = loss(x, a, b);
      v[i] = orig - h;
      const double lm = loss(x, a, b);
      v[i] = orig;
      const double fd = (lp - lm) / (2 * h), an = double(grad[i]) - (base ? double((*base)[i]) : 0.0);
      EXPECT_NEAR(an, fd, 1e-4 * (1 + std::fabs(fd))) << what << " " << i;
    }
  };
  check(x, dx, &dx0, "dx (accumulated onto 0.25)");
  check(a, da, nullptr, "dA");
  check(b, db, nullptr, "dB");
}

// Whole model, frozen base: the adapters' gradients by central differences
// of the f32 forward (tolerance as the full-model check in forward_test).
// Layer 0's adapters see the gradient through layer 1's base and adapter
// paths, so dx through both is covered too.
void model_gradient_check(const ModelConfig& c) {
  LoraModel m(c, all_linear(3, 6));
  auto b = full_batch({random_tokens(7, int(c.vocab_size), 1), random_tokens(5, int(c.vocab_size), 2)}, 8);
  const int64_t R = int64_t(b.logit_rows.size());
  auto probe = test::randn(R * c.vocab_size, 3);
  KvCache kv(c, 64, 4);
  Workspace ws;
  ForwardResult r;
  Activations acts;
  ForwardOptions opt;
  opt.save_activations = true;
  opt.record_experts = true;
  forward(m.ctx, *m.weights, kv, ws, b, opt, &r, &acts);
  const size_t lbytes = size_t(m.lora_layout.numel()) * 4;
  Buffer scratch, lgrad(lbytes);
  const ModelParams frozen = frozen_base_grads(m.layout, scratch, host_allocator());
  const LoraParams lg = bind_lora(m.lora_layout, lgrad.as<float>());
  acts.lora_grads = &lg;
  backward(m.ctx, *m.weights, kv, ws, b, acts, Tensor(probe.data(), DType::F32, {R, c.vocab_size}), frozen);

  // The same backward with the base's gradients taken too gives the same
  // adapter gradients: skipping the frozen GEMMs changes nothing else.
  {
    Buffer full(m.layout.nbytes()), lgrad2(lbytes);
    const LoraParams lg2 = bind_lora(m.lora_layout, lgrad2.as<float>());
    KvCache kv2(c, 64, 4);
    Activations acts2;
    ForwardResult r2;
    forward(m.ctx, *m.weights, kv2, ws, b, opt, &r2, &acts2);
    acts2.lora_grads = &lg2;
    backward(m.ctx, *m.weights, kv2, ws, b, acts2, Tensor(probe.data(), DType::F32, {R, c.vocab_size}),
             bind(m.layout, full.as<float>()));
    EXPECT_EQ(std::memcmp(lgrad.data(), lgrad2.data(), lbytes), 0);
  }

  double gmax = 0;
  for (int64_t i = 0; i < m.lora_layout.numel(); ++i)
    gmax = std::max(gmax, double(std::fabs(lgrad.as<float>()[i])));
  ASSERT_GT(gmax, 0.0);
  std::mt19937 g(5);
  int checked = 0, skipped = 0;
  const int64_t rank = m.lora_layout.rank();
  std::vector<std::tuple<std::string, int64_t, int64_t>> tensors;  // name, offset, numel
  for (const auto& p : m.lora_layout.projections()) {
    tensors.emplace_back(p.a_name, p.a_offset, rank * p.in_features);
    tensors.emplace_back(p.b_name, p.b_offset, p.out_features * rank);
  }
  for (const auto& [name, offset, numel] : tensors) {
    for (int trial = 0; trial < 3; ++trial) {
      const int64_t j = offset + int64_t(g() % uint64_t(numel));
      float* w = m.lora_buf.as<float>() + j;
      const float orig = *w;
      const float eps = 2e-3f * std::max(1.0f, std::fabs(orig));
      auto eval = [&](float v) {
        *w = v;
        KvCache kv3(c, 64, 4);
        ForwardResult r3;
        ForwardOptions o3;
        o3.record_experts = true;
        forward(m.ctx, *m.weights, kv3, ws, b, o3, &r3);
        double sum = 0;
        for (int64_t i = 0; i < r3.logits.numel(); ++i) sum += double(r3.logits.f32()[i]) * probe[size_t(i)];
        return std::make_pair(sum, r3.routed_experts);
      };
      auto [lp, ep] = eval(orig + eps);
      auto [lm, em] = eval(orig - eps);
      *w = orig;
      if (ep != r.routed_experts || em != r.routed_experts) {  // top-k flipped: not differentiable here
        ++skipped;
        continue;
      }
      const double fd = (lp - lm) / (2.0 * double(eps));
      EXPECT_NEAR(lgrad.as<float>()[j], fd, 1e-2 * std::fabs(fd) + 2e-3 * gmax)
          << name << " element " << j - offset;
      ++checked;
    }
  }
  EXPECT_GT(checked, int(tensors.size()));
  EXPECT_LE(skipped, checked / 4);
}

TEST(LoraGrad, DenseQwen3) {
  model_gradient_check(dense_config());
}
TEST(LoraGrad, MoeWithSharedExpertAndDenseFirstLayer) {
  model_gradient_check(moe_config());
}
// DeepSeek-V4: wq_a, wkv, wq_b, wo_b and every expert's w1, w3, w2 (routed
// and shared) through its own forward and backward.
TEST(LoraGrad, DeepSeekV4) {
  model_gradient_check(test::tiny_v4());
}

// Logits of every token of two sequences: prefilled whole in one batch, and
// each sequence alone, in chunks of 3 then decoded token by token.
void alignment_check(const ModelConfig& c, DType storage) {
  LoraModel m(c, all_linear(4, 8), storage);
  const auto s0 = random_tokens(9, int(c.vocab_size), 21), s1 = random_tokens(6, int(c.vocab_size), 22);
  Workspace ws;
  KvCache kv(c, 64, 4);
  ForwardResult full;
  forward(m.ctx, *m.weights, kv, ws, full_batch({s0, s1}, 8), ForwardOptions{}, &full);
  const int64_t V = c.vocab_size;

  // Without adapters the logits differ: the adapters are really applied.
  m.weights->set_lora(nullptr);
  ForwardResult plain;
  KvCache kv0(c, 64, 4);
  forward(m.ctx, *m.weights, kv0, ws, full_batch({s0, s1}, 8), ForwardOptions{}, &plain);
  EXPECT_NE(std::memcmp(plain.logits.f32(), full.logits.f32(), size_t(15 * V) * 4), 0);
  m.weights->set_lora(m.lora.get());

  int64_t row0 = 0;
  for (const auto* seq : {&s0, &s1}) {
    KvCache kv2(c, 64, 4);
    std::vector<int32_t> blocks(8);
    std::iota(blocks.begin(), blocks.end(), 0);
    const int32_t n = int32_t(seq->size());
    int32_t done = 0;
    while (done < n) {
      const int32_t step = done < 6 ? std::min(3, n - done) : 1;  // chunks, then decode
      RaggedBatch b(8);
      b.add_sequence(seq->data() + done, step, done, blocks.data(), 8);
      b.logit_rows.resize(size_t(step));
      std::iota(b.logit_rows.begin(), b.logit_rows.end(), 0);
      ForwardResult part;
      forward(m.ctx, *m.weights, kv2, ws, b, ForwardOptions{}, &part);
      for (int32_t i = 0; i < step; ++i)
        for (int64_t v = 0; v < V; ++v)
          ASSERT_EQ(part.logits.f32()[i * V + v], full.logits.f32()[(row0 + done + i) * V + v])
              << "token " << done + i << " vocab " << v;
      done += step;
    }
    row0 += n;
  }
}

TEST(LoraAlignment, DenseF32) {
  alignment_check(dense_config(), DType::F32);
}
TEST(LoraAlignment, DenseBf16) {
  alignment_check(dense_config(), DType::BF16);
}
TEST(LoraAlignment, DenseFp8) {
  alignment_check(dense_config(), DType::FP8E4M3);
}
TEST(LoraAlignment, Qwen3MoeF32) {
  alignment_check(qwen3_moe_config(), DType::F32);
}
TEST(LoraAlignment, Qwen3MoeBf16) {
  alignment_check(qwen3_moe_config(), DType::BF16);
}
TEST(LoraAlignment, Qwen3MoeFp8) {
  alignment_check(qwen3_moe_config(), DType::FP8E4M3);
}
TEST(LoraAlignment, DeepSeekV4F32) {
  alignment_check(test::tiny_v4(), DType::F32);
}
TEST(LoraAlignment, DeepSeekV4Bf16) {
  alignment_check(test::tiny_v4(), DType::BF16);
}
TEST(LoraAlignment, DeepSeekV4Fp8) {
  alignment_check(test::tiny_v4(), DType::FP8E4M3);
}

}  // namespace
}  // namespace lockstep::model
