// The fp8 export round trip on real files: a model with shapes that are not
// multiples of 128 (Hkv*Dh = 48, intermediate 96, hidden 160), packed at fp8,
// exported in the Hugging Face FP8 layout, loaded and packed at fp8 again
// gives every packed byte and scale back, the export holds exactly the
// weights the fp8 kernels multiply by, and the logprobs of fixed sequences
// are bitwise equal; scored at bf16 or f32 the export differs (the control).
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "../common/test_util.h"
#include "../model/model_test_util.h"
#include "lockstep/model/export.h"
#include "lockstep/model/params.h"
#include "lockstep/model/pretrained.h"
#include "lockstep/model/safetensors.h"
#include "lockstep/train/trainer.h"

namespace lockstep::train {
namespace {

// The attention and FFN shapes every config below shares: q 144 rows, k and v
// 48 each (the fused wqkv's 128-row blocks would straddle q | k | v), F = 96.
ModelConfig awkward(Architecture a) {
  ModelConfig c;
  c.architecture = a;
  c.vocab_size = 300;
  c.hidden_size = 160;
  c.num_layers = 2;
  c.num_heads = 6;
  c.num_kv_heads = 2;
  c.head_dim = 24;
  c.intermediate_size = 96;
  c.eos_token_ids = {2};
  return c;
}

ModelConfig dense_qwen3() {
  ModelConfig c = awkward(Architecture::Qwen3);
  c.qk_norm = true;
  return c;
}

ModelConfig qwen3_moe() {
  ModelConfig c = awkward(Architecture::Qwen3Moe);
  c.qk_norm = true;
  c.num_experts = 4;
  c.num_experts_per_tok = 2;
  c.moe_intermediate_size = 96;
  c.norm_topk_prob = true;
  c.mlp_only_layers = {1};
  return c;
}

// q/k/v biases and a gated shared expert (its gate | up fused too).
ModelConfig qwen2_moe() {
  ModelConfig c = awkward(Architecture::Qwen2Moe);
  c.qkv_bias = true;
  c.num_experts = 4;
  c.num_experts_per_tok = 2;
  c.moe_intermediate_size = 96;
  c.n_shared_experts = 1;
  c.shared_expert_intermediate_size = 80;
  c.shared_expert_gate = true;
  return c;
}

std::vector<TrainSequence> sequences(int64_t vocab) {
  std::vector<TrainSequence> out;
  for (int s = 0; s < 3; ++s) {
    TrainSequence t;
    for (int i = 0; i < 10 + 4 * s; ++i) t.tokens.push_back(int32_t((i * 53 + s * 17 + 5) % vocab));
    t.prompt_len = 2 + s;
    out.push_back(std::move(t));
  }
  return out;
}

std::vector<float> logprobs(const ModelConfig& c, const float* params, DType precision) {
  const ParamLayout layout(c);
  Buffer p = alloc_params(layout);
  std::memcpy(p.data(), params, layout.nbytes());
  Scorer s(Context{}, c, std::move(p), 512, TrainerConfig{}.kv_block_size, precision, 128);
  std::vector<float> all;
  for (const TokenScores& t : s.score(sequences(c.vocab_size), ScoreOptions{}))
    all.insert(all.end(), t.logp.begin(), t.logp.end());
  return all;
}

bool same_bytes(const Buffer& a, const Buffer& b) {
  return a.size() == b.size() && (a.size() == 0 || std::memcmp(a.data(), b.data(), a.size()) == 0);
}

// Every packed projection of a and b: the same bytes and the same scales.
void expect_same_packing(const model::ModelWeights& a, const model::ModelWeights& b) {
  auto check = [](const kernels::PackedWeight& x, const kernels::PackedWeight& y, const std::string& what) {
    EXPECT_EQ(x.storage, y.storage) << what;
    EXPECT_TRUE(same_bytes(x.data, y.data)) << what << ": packed bytes differ";
    EXPECT_TRUE(same_bytes(x.block_scales, y.block_scales)) << what << ": scales differ";
    EXPECT_TRUE(same_bytes(x.panel_scales, y.panel_scales)) << what << ": panel scales differ";
  };
  for (int64_t i = 0; i < a.config().num_layers; ++i) {
    const model::PackedLayer &x = a.layer(i), &y = b.layer(i);
    const std::string l = "layer " + std::to_string(i);
    check(x.wqkv, y.wqkv, l + " wqkv");
    check(x.wo, y.wo, l + " wo");
    check(x.mlp.gate_up, y.mlp.gate_up, l + " gate_up");
    check(x.mlp.down, y.mlp.down, l + " down");
    ASSERT_EQ(x.experts.size(), y.experts.size());
    for (size_t e = 0; e < x.experts.size(); ++e) {
      check(x.experts[e].gate_up, y.experts[e].gate_up, l + " expert gate_up");
      check(x.experts[e].down, y.experts[e].down, l + " expert down");
    }
    check(x.shared.gate_up, y.shared.gate_up, l + " shared gate_up");
    check(x.shared.down, y.shared.down, l + " shared down");
  }
  check(a.lm_head(), b.lm_head(), "lm_head");
}

// The export's files as an outside reader sees them: projections F8_E4M3 with
// F32 (ceil(out/128), ceil(in/128)) weight_scale_inv, the rest F32, and the
// quantization_config serving engines read.
void expect_fp8_layout(const std::string& dir, const ParamLayout& layout) {
  SafetensorsFile f(dir + "/model.safetensors");
  int64_t quantized = 0;
  for (const ParamInfo& p : layout.params()) {
    const SafetensorsEntry* e = f.find(p.name);
    ASSERT_NE(e, nullptr) << p.name;
    const bool proj = p.layer >= 0 && p.shape.size() == 2 && p.name.find("_proj.weight") != std::string::npos;
    EXPECT_EQ(e->dtype, proj ? "F8_E4M3" : "F32") << p.name;
    EXPECT_EQ(e->shape, p.shape) << p.name;
    if (!proj) continue;
    ++quantized;
    const SafetensorsEntry* s = f.find(p.name + "_scale_inv");
    ASSERT_NE(s, nullptr) << p.name;
    EXPECT_EQ(s->dtype, "F32");
    EXPECT_EQ(s->shape, (std::vector<int64_t>{(p.shape[0] + 127) / 128, (p.shape[1] + 127) / 128})) << p.name;
  }
  EXPECT_GT(quantized, 0);
  std::ifstream in(dir + "/config.json");
  const auto j = nlohmann::json::parse(in);
  const nlohmann::json want = {{"quant_method", "fp8"},
                               {"fmt", "e4m3"},
                               {"activation_scheme", "dynamic"},
                               {"weight_block_size", {128, 128}}};
  EXPECT_EQ(j.at("quantization_config"), want);
}

void check_round_trip(const ModelConfig& c, const std::string& tag) {
  test::TempDir dir(tag);
  const ParamLayout layout(c);
  Buffer p = alloc_params(layout);
  init_params(layout, p.as<float>(), 7, 0.05f);
  save_pretrained(dir.str("src"), c, layout, p.as<float>());
  export_pretrained(dir.str("src"), dir.str("fp8"), SaveFormat::FP8);
  expect_fp8_layout(dir.str("fp8"), layout);
  PretrainedModel back = load_pretrained(dir.str("fp8"));
  ASSERT_TRUE(back.layout.same_as(layout));

  // The export is the effective (straight-through) weights, bit for bit.
  const Context ctx;
  model::ModelWeights a(ctx, layout, p.as<float>(), DType::FP8E4M3, 128, {}, /*effective=*/true);
  test::expect_bits_equal(a.backward_params().embed.f32(), back.params.as<float>(), layout.numel(),
                          "export vs effective weights");
  model::ModelWeights b(ctx, back.layout, back.params.as<float>(), DType::FP8E4M3, 128);
  expect_same_packing(a, b);

  const std::vector<float> want = logprobs(c, p.as<float>(), DType::FP8E4M3);
  const std::vector<float> got = logprobs(c, back.params.as<float>(), DType::FP8E4M3);
  ASSERT_EQ(want.size(), got.size());
  test::expect_bits_equal(want.data(), got.data(), int64_t(want.size()), "fp8 logprobs");
  // The control: the export at another precision is another model.
  for (DType other : {DType::BF16, DType::F32}) {
    const std::vector<float> x = logprobs(c, back.params.as<float>(), other);
    EXPECT_NE(std::memcmp(x.data(), want.data(), want.size() * sizeof(float)), 0) << dtype_name(other);
  }
}

TEST(Fp8Export, DenseQwen3RoundTripsBitForBit) {
  check_round_trip(dense_qwen3(), "fp8x-dense");
}
TEST(Fp8Export, Qwen3MoeRoundTripsBitForBit) {
  check_round_trip(qwen3_moe(), "fp8x-moe");
}
TEST(Fp8Export, Qwen2MoeWithSharedExpertRoundTripsBitForBit) {
  check_round_trip(qwen2_moe(), "fp8x-q2moe");
}

// A bf16 export loads as the master rounded to bf16 (nearest even), every tensor.
TEST(Fp8Export, Bf16ExportLoadsItsRoundedValues) {
  const ModelConfig c = dense_qwen3();
  test::TempDir dir("fp8x-bf16");
  const ParamLayout layout(c);
  Buffer p = alloc_params(layout);
  init_params(layout, p.as<float>(), 8, 0.05f);
  save_pretrained(dir.str("src"), c, layout, p.as<float>());
  export_pretrained(dir.str("src"), dir.str("bf16"), SaveFormat::BF16);
  PretrainedModel back = load_pretrained(dir.str("bf16"));
  for (int64_t i = 0; i < layout.numel(); ++i)
    ASSERT_EQ(f32_bits(back.params.as<float>()[i]), f32_bits(round_bf16(p.as<float>()[i]))) << i;
}

TEST(Fp8Export, RefusesANonEmptyTargetAndWritesIntoAnEmptyOne) {
  const ModelConfig c = dense_qwen3();
  test::TempDir dir("fp8x-target");
  const ParamLayout layout(c);
  Buffer p = alloc_params(layout);
  init_params(layout, p.as<float>(), 9, 0.05f);
  save_pretrained(dir.str("src"), c, layout, p.as<float>());
  std::ofstream(dir.str("src/tokenizer.json")) << "{}";
  std::filesystem::create_directories(dir.str("empty"));
  export_pretrained(dir.str("src"), dir.str("empty"), SaveFormat::FP8);
  EXPECT_TRUE(std::filesystem::exists(dir.str("empty/tokenizer.json")));
  EXPECT_TRUE(std::filesystem::exists(dir.str("empty/model.safetensors")));
  const std::string before = test::read_bytes(dir.str("empty/model.safetensors"));
  test::expect_error([&] { export_pretrained(dir.str("src"), dir.str("empty"), SaveFormat::F32); },
                     {"empty", "exists and is not an empty directory"});
  EXPECT_EQ(test::read_bytes(dir.str("empty/model.safetensors")), before);
  // Nothing left behind: only src and the export.
  int entries = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir.path())) entries += e.exists() ? 1 : 0;
  EXPECT_EQ(entries, 2);
}

}  // namespace
}  // namespace lockstep::train
