// ParamLayout and bind(): Hugging Face names and shapes for dense and MoE
// models, total sizes, views that tile the flat buffer exactly, fused views
// over adjacent tensors, and the deterministic, thread-independent init.
#include "lockstep/model/params.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "common/test_util.h"
#include "lockstep/model/config_toml.h"
#include "model/model_test_util.h"

namespace lockstep {
namespace {

using test::expect_error;

int64_t numel(const std::vector<int64_t>& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

TEST(ParamLayout, DenseNamesShapesAndSize) {
  ModelConfig c = test::tiny_dense_config();  // Llama, tied, V=32 D=16 L=2 H=Hkv=4 Dh=4 F=20
  ParamLayout l(c);
  std::vector<std::string> names;
  for (const auto& p : l.params()) names.push_back(p.name);
  const std::vector<std::string> want = {"model.embed_tokens.weight",
                                         "model.layers.0.input_layernorm.weight",
                                         "model.layers.0.self_attn.q_proj.weight",
                                         "model.layers.0.self_attn.k_proj.weight",
                                         "model.layers.0.self_attn.v_proj.weight",
                                         "model.layers.0.self_attn.o_proj.weight",
                                         "model.layers.0.post_attention_layernorm.weight",
                                         "model.layers.0.mlp.gate_proj.weight",
                                         "model.layers.0.mlp.up_proj.weight",
                                         "model.layers.0.mlp.down_proj.weight",
                                         "model.layers.1.input_layernorm.weight",
                                         "model.layers.1.self_attn.q_proj.weight",
                                         "model.layers.1.self_attn.k_proj.weight",
                                         "model.layers.1.self_attn.v_proj.weight",
                                         "model.layers.1.self_attn.o_proj.weight",
                                         "model.layers.1.post_attention_layernorm.weight",
                                         "model.layers.1.mlp.gate_proj.weight",
                                         "model.layers.1.mlp.up_proj.weight",
                                         "model.layers.1.mlp.down_proj.weight",
                                         "model.norm.weight"};  // no lm_head: tied
  EXPECT_EQ(names, want);
  EXPECT_EQ(l.at("model.embed_tokens.weight").shape, (std::vector<int64_t>{32, 16}));
  EXPECT_EQ(l.at("model.layers.1.self_attn.o_proj.weight").shape, (std::vector<int64_t>{16, 16}));
  EXPECT_EQ(l.at("model.layers.0.mlp.gate_proj.weight").shape, (std::vector<int64_t>{20, 16}));
  EXPECT_EQ(l.at("model.layers.0.mlp.down_proj.weight").shape, (std::vector<int64_t>{16, 20}));
  const int64_t per_layer = 16 + 4 * 16 * 16 + 16 + 3 * 20 * 16;
  EXPECT_EQ(l.numel(), 32 * 16 + 2 * per_layer + 16);
  EXPECT_EQ(l.nbytes(), static_cast<size_t>(l.numel()) * 4);
  EXPECT_EQ(l.find("lm_head.weight"), nullptr);
  expect_error([&] { l.at("lm_head.weight"); }, {"lm_head.weight"});

  c.tie_word_embeddings = false;
  ParamLayout untied(c);
  EXPECT_EQ(untied.params().back().name, "lm_head.weight");
  EXPECT_EQ(untied.numel(), l.numel() + 32 * 16);
}

TEST(ParamLayout, QwenDenseBiasesAndNorms) {
  ModelConfig c = test::tiny_dense_config();
  c.architecture = Architecture::Qwen2;
  c.qkv_bias = true;
  c.num_kv_heads = 2;
  ParamLayout l2(c);
  EXPECT_EQ(l2.at("model.layers.0.self_attn.q_proj.bias").shape, (std::vector<int64_t>{16}));
  EXPECT_EQ(l2.at("model.layers.0.self_attn.k_proj.bias").shape, (std::vector<int64_t>{8}));
  EXPECT_EQ(l2.at("model.layers.0.self_attn.k_proj.bias").kind, ParamKind::Bias);
  EXPECT_EQ(l2.find("model.layers.0.self_attn.q_norm.weight"), nullptr);
  c.architecture = Architecture::Qwen3;
  c.qkv_bias = false;
  c.qk_norm = true;
  ParamLayout l3(c);
  EXPECT_EQ(l3.at("model.layers.1.self_attn.k_norm.weight").shape, (std::vector<int64_t>{4}));
  EXPECT_EQ(l3.at("model.layers.1.self_attn.k_norm.weight").kind, ParamKind::Norm);
  EXPECT_EQ(l3.find("model.layers.0.self_attn.q_proj.bias"), nullptr);
}

TEST(ParamLayout, MoeNamesShapesAndSize) {
  const ModelConfig c =
      test::tiny_moe_config();  // V=64 D=16 L=3 H=4 Hkv=2 Dh=8 F=24 E=4 Fe=12, layer 1 dense
  ParamLayout l(c);
  EXPECT_EQ(l.at("model.layers.0.mlp.gate.weight").shape, (std::vector<int64_t>{4, 16}));
  EXPECT_EQ(l.at("model.layers.0.mlp.experts.3.gate_proj.weight").shape, (std::vector<int64_t>{12, 16}));
  EXPECT_EQ(l.at("model.layers.2.mlp.experts.0.down_proj.weight").shape, (std::vector<int64_t>{16, 12}));
  EXPECT_EQ(l.at("model.layers.1.mlp.gate_proj.weight").shape,
            (std::vector<int64_t>{24, 16}));  // dense layer
  EXPECT_EQ(l.find("model.layers.1.mlp.gate.weight"), nullptr);
  EXPECT_EQ(l.find("model.layers.0.mlp.gate_proj.weight"), nullptr);
  EXPECT_EQ(l.find("model.layers.0.mlp.gate.e_score_correction_bias"), nullptr);
  EXPECT_EQ(l.at("model.layers.0.self_attn.q_norm.weight").shape, (std::vector<int64_t>{8}));
  const int64_t attn = 16 + 32 * 16 + 2 * 16 * 16 + 8 + 8 + 16 * 32 + 16;
  const int64_t moe = 4 * 16 + 4 * 3 * 12 * 16;
  const int64_t dense = 3 * 24 * 16;
  EXPECT_EQ(l.numel(), 64 * 16 + 3 * attn + 2 * moe + dense + 16 + 64 * 16);
  int64_t sum = 0;
  for (const auto& p : l.params()) {
    EXPECT_EQ(p.numel, numel(p.shape)) << p.name;
    sum += p.numel;
  }
  EXPECT_EQ(sum, l.numel());
}

TEST(ParamLayout, SharedExpertNamesFollowTheArchitecture) {
  ModelConfig d = test::tiny_moe_config();
  d.architecture = Architecture::Dots1;
  d.mlp_only_layers.clear();
  d.first_k_dense_replace = 1;
  d.router_scoring = RouterScoring::Sigmoid;
  d.score_correction_bias = true;
  d.n_shared_experts = 2;
  d.shared_expert_intermediate_size = 24;
  ParamLayout l(d);
  EXPECT_EQ(l.at("model.layers.1.mlp.gate.e_score_correction_bias").shape, (std::vector<int64_t>{4}));
  EXPECT_EQ(l.at("model.layers.1.mlp.gate.e_score_correction_bias").kind, ParamKind::Bias);
  EXPECT_EQ(l.at("model.layers.2.mlp.shared_experts.up_proj.weight").shape, (std::vector<int64_t>{24, 16}));
  EXPECT_EQ(l.at("model.layers.2.mlp.shared_experts.down_proj.weight").shape, (std::vector<int64_t>{16, 24}));
  EXPECT_NE(l.find("model.layers.0.mlp.gate_proj.weight"), nullptr);  // first layer dense
  EXPECT_EQ(l.find("model.layers.0.mlp.shared_experts.up_proj.weight"), nullptr);

  ModelConfig q = test::tiny_moe_config();
  q.architecture = Architecture::Qwen2Moe;
  q.qk_norm = false;
  q.qkv_bias = true;
  q.n_shared_experts = 1;
  q.shared_expert_intermediate_size = 40;
  q.shared_expert_gate = true;
  ParamLayout lq(q);
  EXPECT_EQ(lq.at("model.layers.0.mlp.shared_expert.gate_proj.weight").shape, (std::vector<int64_t>{40, 16}));
  EXPECT_EQ(lq.at("model.layers.0.mlp.shared_expert_gate.weight").shape, (std::vector<int64_t>{1, 16}));
  EXPECT_EQ(lq.find("model.layers.0.mlp.shared_experts.gate_proj.weight"), nullptr);
}

TEST(ParamLayout, InvalidConfigIsRejected) {
  ModelConfig c = test::tiny_moe_config();
  c.num_experts_per_tok = 5;
  expect_error([&] { ParamLayout l(c); }, {"num_experts_per_tok"});
}

// Every distinct (non-fused) view of a bound model.
std::vector<std::pair<std::string, Tensor>> leaf_views(const ModelParams& m, const ModelConfig& c) {
  std::vector<std::pair<std::string, Tensor>> v;
  auto add = [&](const std::string& n, const Tensor& t) {
    if (t.data) v.emplace_back(n, t);
  };
  add("embed", m.embed);
  add("final_norm", m.final_norm);
  if (!c.tie_word_embeddings) add("lm_head", m.lm_head);
  auto add_mlp = [&](const std::string& n, const MlpParams& p) {
    add(n + ".gate", p.w_gate);
    add(n + ".up", p.w_up);
    add(n + ".down", p.w_down);
  };
  for (size_t i = 0; i < m.layers.size(); ++i) {
    const LayerParams& L = m.layers[i];
    std::string p = "L";
    p += std::to_string(i);
    const std::vector<std::pair<const char*, Tensor>> singles = {{"attn_norm", L.attn_norm},
                                                                 {"wq", L.wq},
                                                                 {"wk", L.wk},
                                                                 {"wv", L.wv},
                                                                 {"bq", L.bq},
                                                                 {"bk", L.bk},
                                                                 {"bv", L.bv},
                                                                 {"q_norm", L.q_norm},
                                                                 {"k_norm", L.k_norm},
                                                                 {"wo", L.wo},
                                                                 {"mlp_norm", L.mlp_norm},
                                                                 {"router", L.router},
                                                                 {"router_bias", L.router_bias},
                                                                 {"shared_gate", L.shared_gate}};
    for (const auto& [n, t] : singles) add(p + "." + n, t);
    add_mlp(p + ".mlp", L.mlp);
    add_mlp(p + ".shared", L.shared);
    for (size_t e = 0; e < L.experts.size(); ++e) add_mlp(p + ".expert" + std::to_string(e), L.experts[e]);
  }
  return v;
}

void check_tiling(const ModelConfig& c) {
  SCOPED_TRACE(architecture_name(c.architecture));
  ParamLayout l(c);
  Buffer buf = alloc_params(l);
  float* base = buf.as<float>();
  ASSERT_EQ(reinterpret_cast<uintptr_t>(base) % 64, 0u);
  ModelParams m = bind(l, base);
  auto views = leaf_views(m, c);
  EXPECT_EQ(views.size(), l.params().size());
  std::vector<std::pair<int64_t, int64_t>> spans;
  for (const auto& [n, t] : views) {
    const int64_t off = t.ptr<float>() - base;
    EXPECT_GE(off, 0) << n;
    EXPECT_LE(off + t.numel(), l.numel()) << n;
    EXPECT_TRUE(t.is_contiguous()) << n;
    EXPECT_EQ(t.dtype, DType::F32) << n;
    spans.emplace_back(off, off + t.numel());
  }
  std::sort(spans.begin(), spans.end());
  int64_t at = 0;
  for (const auto& [b, e] : spans) {
    EXPECT_EQ(b, at) << "gap or overlap at float " << at;
    at = e;
  }
  EXPECT_EQ(at, l.numel()) << "views do not cover the buffer";

  // Views agree with the name table.
  for (const auto& p : l.params()) EXPECT_GE(p.offset, 0);
  EXPECT_EQ(m.embed.ptr<float>(), base + l.at("model.embed_tokens.weight").offset);
  if (c.tie_word_embeddings) {
    EXPECT_EQ(m.lm_head.data, m.embed.data);
  }
  const int64_t D = c.hidden_size;
  for (size_t i = 0; i < m.layers.size(); ++i) {
    const LayerParams& L = m.layers[i];
    const std::string p = "model.layers." + std::to_string(i) + ".";
    EXPECT_EQ(L.is_moe, c.is_moe_layer(static_cast<int64_t>(i)));
    EXPECT_EQ(L.wk.ptr<float>(), base + l.at(p + "self_attn.k_proj.weight").offset);
    check_shape(L.wqkv, {c.q_dim() + 2 * c.kv_dim(), D}, "wqkv");
    EXPECT_EQ(L.wqkv.data, L.wq.data);
    check_shape(L.wo, {D, c.q_dim()}, "wo");
    if (c.qkv_bias) {
      EXPECT_EQ(L.bqkv.data, L.bq.data);
      EXPECT_EQ(L.bqkv.numel(), c.q_dim() + 2 * c.kv_dim());
    } else {
      EXPECT_EQ(L.bq.data, nullptr);
    }
    EXPECT_EQ(L.q_norm.data != nullptr, c.qk_norm);
    if (!L.is_moe) {
      check_shape(L.mlp.w_gate_up, {2 * c.intermediate_size, D}, "mlp.w_gate_up");
      EXPECT_EQ(L.mlp.w_gate_up.data, L.mlp.w_gate.data);
      EXPECT_EQ(L.mlp.w_up.ptr<float>(), L.mlp.w_gate.ptr<float>() + c.intermediate_size * D);
      EXPECT_TRUE(L.experts.empty());
      continue;
    }
    const int64_t E = c.num_experts, Fe = c.moe_intermediate_size;
    check_shape(L.router, {E, D}, "router");
    check_shape(L.experts_gate_up, {E, 2 * Fe, D}, "experts_gate_up");
    check_shape(L.experts_down, {E, D, Fe}, "experts_down");
    ASSERT_EQ(static_cast<int64_t>(L.experts.size()), E);
    for (int64_t e = 0; e < E; ++e) {
      const MlpParams& x = L.experts[static_cast<size_t>(e)];
      EXPECT_EQ(x.w_gate_up.ptr<float>(), L.experts_gate_up.ptr<float>() + e * 2 * Fe * D);
      EXPECT_EQ(x.w_up.ptr<float>(), x.w_gate.ptr<float>() + Fe * D);  // gate then up
      EXPECT_EQ(x.w_down.ptr<float>(), L.experts_down.ptr<float>() + e * D * Fe);
      EXPECT_EQ(x.w_gate.ptr<float>(),
                base + l.at(p + "mlp.experts." + std::to_string(e) + ".gate_proj.weight").offset);
    }
    EXPECT_EQ(L.router_bias.data != nullptr, c.score_correction_bias);
    EXPECT_EQ(L.shared.w_gate.data != nullptr, c.has_shared_expert());
    if (c.has_shared_expert())
      check_shape(L.shared.w_gate_up, {2 * c.shared_expert_intermediate_size, D}, "shared.w_gate_up");
    EXPECT_EQ(L.shared_gate.data != nullptr, c.shared_expert_gate);
  }
}

TEST(Bind, ViewsTileTheBufferExactly) {
  check_tiling(test::tiny_dense_config());
  ModelConfig c = test::tiny_dense_config();
  c.tie_word_embeddings = false;
  c.architecture = Architecture::Qwen2;
  c.qkv_bias = true;
  check_tiling(c);
  check_tiling(test::tiny_moe_config());
  const std::filesystem::path root =
      std::filesystem::path(__FILE__).parent_path().parent_path().parent_path();
  check_tiling(model_config_from_toml_file((root / "configs/test/moe-tiny.toml").string()));  // Dots1
  ModelConfig q = test::tiny_moe_config();
  q.architecture = Architecture::Qwen2Moe;
  q.qk_norm = false;
  q.qkv_bias = true;
  q.n_shared_experts = 1;
  q.shared_expert_intermediate_size = 40;
  q.shared_expert_gate = true;
  check_tiling(q);
}

TEST(Bind, BenchConfigSizes) {
  const std::filesystem::path root =
      std::filesystem::path(__FILE__).parent_path().parent_path().parent_path();
  // The sizes quoted in the files' comments.
  EXPECT_EQ(ParamLayout(model_config_from_toml_file((root / "configs/bench/moe-tiny.toml").string())).numel(),
            8006144);
  EXPECT_EQ(
      ParamLayout(model_config_from_toml_file((root / "configs/bench/moe-small.toml").string())).numel(),
      115418624);
  // The real-size shapes: the parameter counts of the Hugging Face releases
  // (Qwen3-0.6B 596,049,920; 1.7B 1,720,574,976; 4B 4,022,468,096, tied embeddings).
  EXPECT_EQ(
      ParamLayout(model_config_from_toml_file((root / "configs/bench/qwen3-0.6b.toml").string())).numel(),
      596049920);
  EXPECT_EQ(
      ParamLayout(model_config_from_toml_file((root / "configs/bench/qwen3-1.7b.toml").string())).numel(),
      1720574976);
  EXPECT_EQ(ParamLayout(model_config_from_toml_file((root / "configs/bench/qwen3-4b.toml").string())).numel(),
            4022468096);
  // One Qwen3-30B-A3B layer with the real embedding and head (the layer is
  // 623,120,640 of the HF release's 30,532,122,624 = 48 layers + 622,331,904).
  EXPECT_EQ(
      ParamLayout(model_config_from_toml_file((root / "configs/bench/qwen3-30b-a3b-layer.toml").string()))
          .numel(),
      1245452544);
  // One V4-Flash CSA block with the real embedding and head: 7.65 B, 6.44 B of
  // them in the routed experts (V4-Flash: 284.3 B in 43 blocks).
  EXPECT_EQ(
      ParamLayout(model_config_from_toml_file((root / "configs/bench/v4-flash-layer.toml").string())).numel(),
      7654690299);
}

TEST(InitParams, DeterministicAndThreadIndependent) {
  const ModelConfig c = test::tiny_moe_config();
  ParamLayout l(c);
  Buffer a = alloc_params(l), b = alloc_params(l), d = alloc_params(l);
  init_params(l, a.as<float>(), 1234);
  ThreadPool pool(2);
  Context ctx{&pool, 0};
  init_params(l, b.as<float>(), 1234, 0.02f, &ctx);
  test::expect_bits_equal(a.as<float>(), b.as<float>(), l.numel(), "1 vs 2 threads");
  init_params(l, d.as<float>(), 1235);
  int64_t same = 0;
  for (int64_t i = 0; i < l.numel(); ++i) same += a.as<float>()[i] == d.as<float>()[i];
  EXPECT_LT(same, l.numel() / 4) << "another seed should change the matrices";
}

TEST(InitParams, KindsAndStatistics) {
  ModelConfig c = test::tiny_moe_config();
  c.architecture = Architecture::Dots1;
  c.mlp_only_layers.clear();
  c.router_scoring = RouterScoring::Sigmoid;
  c.score_correction_bias = true;
  c.n_shared_experts = 1;
  c.shared_expert_intermediate_size = 12;
  ParamLayout l(c);
  Buffer buf = alloc_params(l);
  float* w = buf.as<float>();
  init_params(l, w, 7, 0.05f);
  double sum = 0, sq = 0;
  int64_t n = 0;
  for (const auto& p : l.params()) {
    for (int64_t j = 0; j < p.numel; ++j) {
      const float x = w[p.offset + j];
      if (p.kind == ParamKind::Norm) {
        ASSERT_EQ(x, 1.0f) << p.name;
      }
      if (p.kind == ParamKind::Bias) {
        ASSERT_EQ(x, 0.0f) << p.name;
      }
      if (p.kind == ParamKind::Matrix) {
        ASSERT_TRUE(std::isfinite(x)) << p.name;
        sum += x;
        sq += double(x) * x;
        ++n;
      }
    }
  }
  const double mean = sum / n, sd = std::sqrt(sq / n - mean * mean);
  EXPECT_NEAR(mean, 0.0, 4 * 0.05 / std::sqrt(double(n)));
  EXPECT_NEAR(sd, 0.05, 0.05 * 0.03);
}

TEST(InitParams, ValuesDependOnNameNotPosition) {
  // Adding layers does not change the embedding or layer 0.
  ModelConfig c = test::tiny_dense_config();
  ParamLayout small(c);
  c.num_layers = 3;
  ParamLayout big(c);
  Buffer a = alloc_params(small), b = alloc_params(big);
  init_params(small, a.as<float>(), 99);
  init_params(big, b.as<float>(), 99);
  for (const char* name : {"model.embed_tokens.weight", "model.layers.0.mlp.up_proj.weight"}) {
    const ParamInfo& pa = small.at(name);
    const ParamInfo& pb = big.at(name);
    test::expect_bits_equal(a.as<float>() + pa.offset, b.as<float>() + pb.offset, pa.numel, name);
  }
}

}  // namespace
}  // namespace lockstep
