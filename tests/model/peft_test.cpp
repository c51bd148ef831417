// LoRA adapters in PEFT's format: the adapted projections and their PEFT
// names on dense, MoE and shared-expert models; adapter_model.safetensors
// round trips (bit-exact in F32, bf16-rounded in BF16, F16 widened) and every
// refusal naming the file and tensor; merge_lora against hand-computed values
// and an independent double reference; B = 0 giving the base back bit for
// bit; export_merged_lora end to end.
#include "lockstep/model/peft.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <tuple>

#include "common/v4_config.h"
#include "lockstep/base/rng.h"
#include "lockstep/model/export.h"
#include "lockstep/model/pretrained.h"
#include "lockstep/model/safetensors.h"
#include "model/model_test_util.h"

namespace lockstep {
namespace {

namespace fs = std::filesystem;
using test::expect_error;
using test::TempDir;

LoraSpec spec_of(int64_t r, double alpha, std::vector<std::string> targets) {
  LoraSpec s;
  s.rank = r;
  s.alpha = alpha;
  s.target_modules = std::move(targets);
  return s;
}

// Random A and B (B non-zero, unlike init_lora), a pure function of seed.
std::vector<float> random_lora(const LoraLayout& l, uint64_t seed) {
  std::vector<float> v(static_cast<size_t>(l.numel()));
  const Philox rng(seed);
  for (size_t j = 0; j < v.size(); ++j) v[j] = 0.1f * rng.normal(1, j);
  return v;
}

std::vector<float> random_model(const ParamLayout& layout, uint64_t seed) {
  std::vector<float> w(static_cast<size_t>(layout.numel()));
  init_params(layout, w.data(), seed, 0.05f);
  return w;
}

bool same_bits(const float* a, const float* b, size_t n) {
  return std::memcmp(a, b, n * sizeof(float)) == 0;
}

// ---- the adapted projections and their names ----

TEST(LoraLayout, DenseNamesShapesAndPacking) {
  const ParamLayout model(test::tiny_dense_config());  // L = 2, D = 16, H*Dh = 16, F = 20
  const LoraLayout l(model, spec_of(4, 8, lora_module_names()));
  ASSERT_EQ(l.projections().size(), 14u);
  const LoraProjection& q = l.projections()[0];
  EXPECT_EQ(q.module, "q_proj");
  EXPECT_EQ(q.base_name, "model.layers.0.self_attn.q_proj.weight");
  EXPECT_EQ(q.a_name, "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight");
  EXPECT_EQ(q.b_name, "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight");
  const LoraProjection& down = l.projections()[6];
  EXPECT_EQ(down.a_name, "base_model.model.model.layers.0.mlp.down_proj.lora_A.weight");
  EXPECT_EQ(down.in_features, 20);
  EXPECT_EQ(down.out_features, 16);
  EXPECT_EQ(l.projections()[7].base_name, "model.layers.1.self_attn.q_proj.weight");
  EXPECT_EQ(l.projections()[7].layer, 1);
  // A (r, in) then B (out, r), back to back, covering the buffer exactly.
  int64_t at = 0;
  for (const auto& p : l.projections()) {
    EXPECT_EQ(model.at(p.base_name).shape, (std::vector<int64_t>{p.out_features, p.in_features}));
    EXPECT_EQ(p.a_offset, at);
    EXPECT_EQ(p.b_offset, at + 4 * p.in_features);
    at = p.b_offset + p.out_features * 4;
  }
  EXPECT_EQ(l.numel(), at);
  // Only the targets; the router-free dense model has nothing else to adapt.
  const LoraLayout qv(model, spec_of(2, 2, {"q_proj", "v_proj"}));
  ASSERT_EQ(qv.projections().size(), 4u);
  EXPECT_EQ(qv.projections()[1].base_name, "model.layers.0.self_attn.v_proj.weight");
  EXPECT_EQ(qv.find_base("model.layers.1.self_attn.q_proj.weight"), &qv.projections()[2]);
  EXPECT_EQ(qv.find_base("model.layers.1.self_attn.k_proj.weight"), nullptr);
}

TEST(LoraLayout, MoeExpertsAndSharedExperts) {
  // Qwen3-MoE: layer 1 dense, layers 0 and 2 with 4 experts and a router.
  const ParamLayout moe(test::tiny_moe_config());
  const LoraLayout l(moe, spec_of(2, 4, {"gate_proj", "up_proj", "down_proj"}));
  ASSERT_EQ(l.projections().size(), 4u * 3 + 3 + 4u * 3);
  EXPECT_EQ(l.projections()[0].a_name,
            "base_model.model.model.layers.0.mlp.experts.0.gate_proj.lora_A.weight");
  EXPECT_EQ(l.projections()[0].expert, 0);
  const LoraProjection* d3 = l.find_base("model.layers.0.mlp.experts.3.down_proj.weight");
  ASSERT_NE(d3, nullptr);
  EXPECT_EQ(d3->b_name, "base_model.model.model.layers.0.mlp.experts.3.down_proj.lora_B.weight");
  EXPECT_EQ(d3->expert, 3);
  EXPECT_EQ(d3->in_features, 12);                                        // Fe
  EXPECT_NE(l.find_base("model.layers.1.mlp.up_proj.weight"), nullptr);  // the dense layer
  for (const auto& p : l.projections())
    EXPECT_EQ(p.base_name.find("mlp.gate.weight"), std::string::npos) << "router adapted: " << p.base_name;

  // Qwen2-MoE: `shared_expert`, whose gate (shared_expert_gate) is not adapted.
  ModelConfig q = test::tiny_moe_config();
  q.architecture = Architecture::Qwen2Moe;
  q.qk_norm = false;
  q.qkv_bias = true;
  q.n_shared_experts = 1;
  q.shared_expert_intermediate_size = 40;
  q.shared_expert_gate = true;
  const ParamLayout q2(q);
  const LoraLayout lq(q2, spec_of(2, 4, lora_module_names()));
  const LoraProjection* sg = lq.find_base("model.layers.2.mlp.shared_expert.gate_proj.weight");
  ASSERT_NE(sg, nullptr);
  EXPECT_EQ(sg->a_name, "base_model.model.model.layers.2.mlp.shared_expert.gate_proj.lora_A.weight");
  EXPECT_EQ(sg->out_features, 40);
  EXPECT_EQ(sg->expert, -1);
  for (const auto& p : lq.projections()) EXPECT_EQ(p.base_name.find("shared_expert_gate"), std::string::npos);
  // Every *_proj matrix of the model, and nothing else: 3 layers x 4
  // attention, 2 MoE layers x (4 experts + 1 shared) x 3, 1 dense layer x 3.
  EXPECT_EQ(lq.projections().size(), 12u + 30 + 3);

  // Dots1 / DeepSeek-V3 naming: `shared_experts`; the router's score
  // correction bias is not adapted.
  ModelConfig d = test::tiny_moe_config();
  d.architecture = Architecture::Dots1;
  d.mlp_only_layers.clear();
  d.first_k_dense_replace = 1;
  d.router_scoring = RouterScoring::Sigmoid;
  d.score_correction_bias = true;
  d.n_shared_experts = 2;
  d.shared_expert_intermediate_size = 24;
  const LoraLayout ld(ParamLayout(d), spec_of(2, 4, {"down_proj"}));
  const LoraProjection* sd = ld.find_base("model.layers.2.mlp.shared_experts.down_proj.weight");
  ASSERT_NE(sd, nullptr);
  EXPECT_EQ(sd->a_name, "base_model.model.model.layers.2.mlp.shared_experts.down_proj.lora_A.weight");
  EXPECT_EQ(sd->in_features, 24);
  EXPECT_EQ(ld.projections().size(), 1u + 2 * (4 + 1));
}

TEST(LoraLayout, SomeExpertsOnly) {
  const ModelConfig c = test::tiny_moe_config();
  const LoraLayout l(ParamLayout(c, 2, 2), spec_of(2, 4, {"up_proj"}));
  EXPECT_EQ(l.find_base("model.layers.0.mlp.experts.0.up_proj.weight"), nullptr);
  EXPECT_NE(l.find_base("model.layers.0.mlp.experts.3.up_proj.weight"), nullptr);
  EXPECT_EQ(l.projections().size(), 2u + 1 + 2);
}

TEST(LoraLayout, InitIsPeftsKaimingAAndZeroB) {
  const ParamLayout model(test::tiny_dense_config());
  const LoraLayout all(model, spec_of(4, 8, lora_module_names()));
  const LoraLayout q_only(model, spec_of(4, 8, {"q_proj"}));
  std::vector<float> a(static_cast<size_t>(all.numel())), b(static_cast<size_t>(q_only.numel()));
  init_lora(all, a.data(), 7);
  init_lora(q_only, b.data(), 7);
  for (const auto& p : all.projections()) {
    const double bound = 1.0 / std::sqrt(static_cast<double>(p.in_features));
    double max_abs = 0;
    for (int64_t j = 0; j < 4 * p.in_features; ++j)
      max_abs = std::max(max_abs, std::fabs(double(a[p.a_offset + j])));
    EXPECT_LE(max_abs, bound);
    EXPECT_GT(max_abs, 0.5 * bound);  // spread over the range, not a constant
    for (int64_t j = 0; j < 4 * p.out_features; ++j) ASSERT_EQ(a[p.b_offset + j], 0.0f);
  }
  // A tensor's values depend on its name only, not on the other targets.
  const LoraProjection& q1 = *all.find_base("model.layers.1.self_attn.q_proj.weight");
  const LoraProjection& q1b = *q_only.find_base("model.layers.1.self_attn.q_proj.weight");
  EXPECT_TRUE(same_bits(a.data() + q1.a_offset, b.data() + q1b.a_offset, 4 * 16));
}

TEST(LoraLayout, Errors) {
  const ParamLayout model(test::tiny_dense_config());
  expect_error([&] { LoraLayout(model, spec_of(0, 8, {"q_proj"})); }, {"r must be >= 1"});
  expect_error([&] { LoraLayout(model, spec_of(2, 8, {"lm_head"})); }, {"cannot adapt module \"lm_head\""});
  expect_error([&] { LoraLayout(ParamLayout(test::tiny_v4()), spec_of(2, 8, {"q_proj"})); },
               {"\"q_proj\"", "DeepSeek-V4", "wq_a"});
  expect_error([&] { LoraLayout(model, spec_of(2, 8, {"wq_a"})); }, {"\"wq_a\"", "q_proj"});
}

// DeepSeek-V4: its own module names, on the main layers' plain projections
// only (not the grouped wo_a, the router, the compressors, the indexer or
// the MTP block), "all-linear" reading as V4's seven.
TEST(LoraLayout, DeepSeekV4Names) {
  ModelConfig c = test::tiny_v4();
  c.num_nextn_predict_layers = 1;
  c.compress_ratios.push_back(0);  // the MTP block's
  const ParamLayout model(c);
  const LoraLayout all(model, spec_of(2, 4, lora_module_names()));
  EXPECT_EQ(all.spec().target_modules, lora_v4_module_names());
  const int64_t L = c.num_layers, E = c.num_experts;
  ASSERT_EQ(int64_t(all.projections().size()), L * (4 + 3 * E + 3));
  for (const LoraProjection& p : all.projections()) {
    EXPECT_LT(p.layer, L) << p.base_name;
    EXPECT_EQ(p.base_name.find("compressor"), std::string::npos) << p.base_name;
    EXPECT_EQ(p.base_name.find("indexer"), std::string::npos) << p.base_name;
    EXPECT_EQ(p.base_name.rfind("layers.", 0), 0u) << p.base_name;
  }
  const LoraProjection* q = all.find_base("layers.3.attn.wq_b.weight");
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(q->a_name, "base_model.model.layers.3.attn.wq_b.lora_A.weight");
  EXPECT_EQ(q->in_features, c.q_lora_rank);
  EXPECT_EQ(q->out_features, c.num_heads * c.head_dim);
  const LoraProjection* w2 = all.find_base("layers.1.ffn.experts.2.w2.weight");
  ASSERT_NE(w2, nullptr);
  EXPECT_EQ(w2->expert, 2);
  EXPECT_EQ(w2->b_name, "base_model.model.layers.1.ffn.experts.2.w2.lora_B.weight");
  EXPECT_NE(all.find_base("layers.0.ffn.shared_experts.w3.weight"), nullptr);
  EXPECT_EQ(all.find_base("layers.0.attn.wo_a.weight"), nullptr);
  EXPECT_EQ(all.find_base("layers.1.attn.compressor.wkv.weight"), nullptr);
  EXPECT_EQ(all.find_base("layers.1.attn.indexer.wq_b.weight"), nullptr);
  EXPECT_EQ(all.find_base("layers.0.ffn.gate.weight"), nullptr);
  const LoraLayout attn(model, spec_of(2, 4, lora_target_modules({"wo_b", "wkv"})));
  EXPECT_EQ(attn.spec().target_modules, (std::vector<std::string>{"wkv", "wo_b"}));
  EXPECT_EQ(int64_t(attn.projections().size()), 2 * L);
  // adapter_config.json round-trips V4's names.
  EXPECT_EQ(parse_adapter_config(adapter_config_json(all.spec()), "a.json").target_modules,
            lora_v4_module_names());
}

// ---- adapter_model.safetensors ----

TEST(AdapterWeights, F32RoundTripIsBitExact) {
  TempDir dir("peft-weights");
  const ParamLayout model(test::tiny_moe_config());
  LoraSpec spec = spec_of(3, 6, lora_module_names());
  spec.base_model_name_or_path = "tiny";
  const LoraLayout l(model, spec);
  const std::vector<float> v = random_lora(l, 11);
  save_adapter(dir.str("adapter"), l, v.data());
  const LoraAdapter back = load_adapter(dir.str("adapter"), model);
  ASSERT_EQ(back.params.size(), v.size());
  EXPECT_TRUE(same_bits(back.params.data(), v.data(), v.size()));
  EXPECT_EQ(back.layout.spec().base_model_name_or_path, "tiny");
  EXPECT_EQ(back.layout.numel(), l.numel());
  // The file holds exactly A and B of each projection, F32, under PEFT's names.
  const SafetensorsFile f(dir.str("adapter/adapter_model.safetensors"));
  EXPECT_EQ(f.entries().size(), 2 * l.projections().size());
  const LoraProjection& p = l.projections()[5];
  const SafetensorsEntry* b = f.find(p.b_name);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->dtype, "F32");
  EXPECT_EQ(b->shape, (std::vector<int64_t>{p.out_features, 3}));

  // The same file read by the format's definition alone (u64 header length,
  // JSON header, data at data_offsets), as PEFT's safetensors reader sees it.
  const std::string bytes = test::read_bytes(dir.str("adapter/adapter_model.safetensors"));
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  const nlohmann::json h = nlohmann::json::parse(bytes.substr(8, n));
  EXPECT_EQ(h.at("__metadata__").at("format"), "pt");
  for (const auto& q : l.projections())
    for (const auto& [name, off, count] : {std::tuple{q.a_name, q.a_offset, 3 * q.in_features},
                                           std::tuple{q.b_name, q.b_offset, 3 * q.out_features}}) {
      const nlohmann::json& e = h.at(name);
      ASSERT_EQ(e.at("dtype"), "F32") << name;
      const uint64_t begin = e.at("data_offsets")[0].get<uint64_t>(),
                     end = e.at("data_offsets")[1].get<uint64_t>();
      ASSERT_EQ(end - begin, uint64_t(count) * 4) << name;
      EXPECT_EQ(std::memcmp(bytes.data() + 8 + n + begin, v.data() + off, size_t(count) * 4), 0) << name;
    }
}

TEST(AdapterWeights, Bf16IsRoundedToNearestEven) {
  TempDir dir("peft-bf16");
  const ParamLayout model(test::tiny_dense_config());
  const LoraLayout l(model, spec_of(2, 4, {"q_proj", "down_proj"}));
  const std::vector<float> v = random_lora(l, 3);
  save_adapter(dir.str(), l, v.data(), DType::BF16);
  EXPECT_EQ(SafetensorsFile(dir.str("adapter_model.safetensors")).entries()[0].dtype, "BF16");
  std::vector<float> back(v.size());
  read_adapter_weights(dir.str(), l, back.data());
  size_t changed = 0;
  for (size_t j = 0; j < v.size(); ++j) {
    ASSERT_EQ(back[j], round_bf16(v[j])) << j;
    changed += back[j] != v[j];
  }
  EXPECT_GT(changed, v.size() / 2);  // the control: bf16 did lose bits
}

TEST(AdapterWeights, F16IsWidened) {
  TempDir dir("peft-f16");
  const ParamLayout model(test::tiny_dense_config());
  const LoraLayout l(model, spec_of(1, 1, {"o_proj"}));
  std::vector<std::vector<uint16_t>> halves;
  halves.reserve(4);  // ts points into them
  std::vector<SafetensorsTensor> ts;
  uint16_t bits = 0x3c00;  // 1.0, then the halves above it
  for (const auto& p : l.projections())
    for (auto [name, n, shape] :
         {std::tuple{p.a_name, p.in_features, std::vector<int64_t>{1, p.in_features}},
          std::tuple{p.b_name, p.out_features, std::vector<int64_t>{p.out_features, 1}}}) {
      halves.emplace_back();
      for (int64_t j = 0; j < n; ++j) halves.back().push_back(bits++);
      ts.push_back({name, shape, nullptr, halves.back().data(), "F16"});
    }
  write_safetensors(dir.str("adapter_model.safetensors"), ts, DType::F32);
  std::vector<float> back(static_cast<size_t>(l.numel()));
  read_adapter_weights(dir.str("adapter_model.safetensors"), l, back.data());  // a file path works too
  const LoraProjection& p = l.projections()[1];
  EXPECT_EQ(back[static_cast<size_t>(p.a_offset)], f16_to_f32(halves[2][0]));
  EXPECT_EQ(back[static_cast<size_t>(p.b_offset + 3)], f16_to_f32(halves[3][3]));
  EXPECT_EQ(back[0], 1.0f);
}

// An adapter file with the tensors of `l`, then edited by `edit` before writing.
void write_edited(const std::string& path, const LoraLayout& l, const std::vector<float>& v,
                  const std::function<void(std::vector<SafetensorsTensor>&)>& edit) {
  std::vector<SafetensorsTensor> ts;
  for (const auto& p : l.projections()) {
    ts.push_back({p.a_name, {l.rank(), p.in_features}, v.data() + p.a_offset});
    ts.push_back({p.b_name, {p.out_features, l.rank()}, v.data() + p.b_offset});
  }
  edit(ts);
  write_safetensors(path, ts, DType::F32);
}

TEST(AdapterWeights, RefusalsNameFileAndTensor) {
  TempDir dir("peft-bad");
  const ParamLayout model(test::tiny_dense_config());
  const LoraLayout l(model, spec_of(2, 4, {"q_proj", "v_proj"}));
  const std::vector<float> v = random_lora(l, 5);
  std::vector<float> out(v.size());
  const std::string file = dir.str("adapter_model.safetensors");
  const std::string b1 = l.projections()[3].b_name;  // layer 1 v_proj B
  auto read = [&] { read_adapter_weights(dir.str(), l, out.data()); };

  write_edited(file, l, v, [&](auto& ts) { ts.erase(ts.begin() + 7); });
  expect_error(read, {file, "tensor '" + b1 + "' missing"});

  write_edited(file, l, v, [&](auto& ts) { ts[7].shape = {16, 1}; });  // 16 x 1 elements of the 16 x 2
  expect_error(read, {file, "tensor '" + b1 + "' has shape [16, 1], expected [16, 2]"});

  // An adapter of rank 4 read as rank 2: the first A names the mismatch.
  const LoraLayout l4(model, spec_of(4, 4, {"q_proj", "v_proj"}));
  const std::vector<float> v4 = random_lora(l4, 5);
  write_edited(file, l4, v4, [](auto&) {});
  expect_error(read,
               {file, "tensor '" + l.projections()[0].a_name + "' has shape [4, 16], expected [2, 16]"});

  const std::string extra = "base_model.model.model.layers.0.self_attn.k_proj.lora_A.weight";
  write_edited(file, l, v, [&](auto& ts) { ts.push_back({extra, {2, 16}, v.data()}); });
  expect_error(read, {file, "unexpected tensor '" + extra + "'"});

  const std::vector<int32_t> ints(32, 1);
  write_edited(file, l, v, [&](auto& ts) { ts[0] = {ts[0].name, {2, 16}, nullptr, ints.data(), "I32"}; });
  expect_error(read, {file, "tensor '" + l.projections()[0].a_name + "' has dtype I32"});

  // A flipped data byte fails the tensor's checksum; a cut file is truncated.
  write_edited(file, l, v, [](auto&) {});
  std::string bytes = test::read_bytes(file);
  bytes[bytes.size() - 5] ^= 0x40;  // inside the last tensor, layer 1 v_proj B
  test::write_bytes(file, bytes);
  expect_error(read, {file, b1, "checksum"});
  test::write_bytes(file, bytes.substr(0, bytes.size() - 100));
  expect_error(read, {file, "truncated"});
  fs::remove(file);
  expect_error(read, {file});
}

// ---- the merge ----

TEST(MergeLora, HandComputedValues) {
  // o_proj of layer 0 (16 x 16), r = 2, alpha = 4: s = 2.
  const ParamLayout model(test::tiny_dense_config());
  const LoraLayout l(model, spec_of(2, 4, {"o_proj"}));
  std::vector<float> w(static_cast<size_t>(model.numel()), 0.0f);
  std::vector<float> ab(static_cast<size_t>(l.numel()), 0.0f);
  const LoraProjection& p = l.projections()[0];
  float* W = w.data() + model.at(p.base_name).offset;
  float* A = ab.data() + p.a_offset;  // (2, 16)
  float* B = ab.data() + p.b_offset;  // (16, 2)
  // Element (0, 0): 1 + 2 * (1 * 0.5 + (-3) * 0.25) = 1 + 2 * (-0.25) = 0.5.
  W[0] = 1.0f;
  A[0] = 0.5f;
  A[16] = 0.25f;
  B[0] = 1.0f;
  B[1] = -3.0f;
  // Element (3, 5): 1 + 2 * (2^-25 + 2^-25) = 1 + 2^-23, representable: the
  // sum is taken in double and rounded once (two f32 additions of 2^-24 each
  // would round back to 1 twice).
  W[3 * 16 + 5] = 1.0f;
  A[5] = std::ldexp(1.0f, -13);
  A[16 + 5] = std::ldexp(1.0f, -13);
  B[3 * 2 + 0] = std::ldexp(1.0f, -12);
  B[3 * 2 + 1] = std::ldexp(1.0f, -12);
  // Element (3, 0): 0 + 2 * (2^-12 * 0.5 + 2^-12 * 0.25) = 1.5 * 2^-12.
  merge_lora(l, ab.data(), model, w.data());
  EXPECT_EQ(W[0], 0.5f);
  EXPECT_EQ(W[3 * 16 + 5], 1.0f + std::ldexp(1.0f, -23));
  EXPECT_EQ(W[3 * 16 + 0], 1.5f * std::ldexp(1.0f, -12));
  EXPECT_EQ(W[1], 0.0f);  // A[0][1] = A[1][1] = 0: untouched
  EXPECT_FALSE(std::signbit(W[1]));
  // Nothing else of the model changed.
  for (const auto& info : model.params()) {
    if (info.name == p.base_name) continue;
    for (int64_t j = 0; j < info.numel; ++j)
      ASSERT_EQ(w[static_cast<size_t>(info.offset + j)], 0.0f) << info.name;
  }
}

TEST(MergeLora, MatchesDoubleReference) {
  const ParamLayout model(test::tiny_moe_config());
  const LoraLayout l(model, spec_of(3, 5, lora_module_names()));
  const std::vector<float> base = random_model(model, 2);
  const std::vector<float> ab = random_lora(l, 9);
  std::vector<float> merged = base;
  merge_lora(l, ab.data(), model, merged.data());
  // The reference: the full product B · A in double, element by element
  // (k in order), then W + s · (B · A) rounded once.
  const double s = 5.0 / 3.0;
  size_t differs = 0;
  for (const auto& p : l.projections()) {
    const int64_t off = model.at(p.base_name).offset;
    for (int64_t o = 0; o < p.out_features; ++o)
      for (int64_t i = 0; i < p.in_features; ++i) {
        double ba = 0;
        for (int64_t k = 0; k < 3; ++k)
          ba += double(ab[size_t(p.b_offset + o * 3 + k)]) *
                double(ab[size_t(p.a_offset + k * p.in_features + i)]);
        const size_t at = size_t(off + o * p.in_features + i);
        ASSERT_EQ(merged[at], static_cast<float>(double(base[at]) + s * ba))
            << p.base_name << " " << o << "," << i;
        differs += merged[at] != base[at];
      }
  }
  EXPECT_GT(differs, size_t(l.numel()));  // the adapter did change the weights
  // The routers, norms and embeddings are the base's.
  for (const auto& info : model.params()) {
    if (l.find_base(info.name)) continue;
    EXPECT_TRUE(same_bits(merged.data() + info.offset, base.data() + info.offset, size_t(info.numel)))
        << info.name;
  }
}

TEST(MergeLora, ZeroBGivesTheBaseBitForBit) {
  const ParamLayout model(test::tiny_moe_config());
  const LoraLayout l(model, spec_of(4, 16, lora_module_names()));
  std::vector<float> base = random_model(model, 4);
  base[size_t(model.at("model.layers.0.self_attn.q_proj.weight").offset)] = -0.0f;  // stays -0, not +0
  std::vector<float> ab(static_cast<size_t>(l.numel()));
  init_lora(l, ab.data(), 1);  // A random, B = 0
  std::vector<float> merged = base;
  merge_lora(l, ab.data(), model, merged.data());
  EXPECT_TRUE(same_bits(merged.data(), base.data(), base.size()));
}

TEST(MergeLora, ThreadCountDoesNotChangeBits) {
  const ParamLayout model(test::tiny_moe_config());
  const LoraLayout l(model, spec_of(2, 3, lora_module_names()));
  const std::vector<float> base = random_model(model, 6);
  const std::vector<float> ab = random_lora(l, 8);
  std::vector<float> one = base, three = base;
  merge_lora(l, ab.data(), model, one.data());
  ThreadPool pool(3);
  const Context ctx{&pool, 0};
  merge_lora(l, ab.data(), model, three.data(), &ctx);
  EXPECT_TRUE(same_bits(one.data(), three.data(), one.size()));
}

TEST(ExportMergedLora, WritesTheMergedModel) {
  TempDir dir("peft-export");
  const ModelConfig c = test::tiny_moe_config();
  const ParamLayout model(c);
  const std::vector<float> base = random_model(model, 12);
  save_pretrained(dir.str("base"), c, model, base.data());
  const LoraLayout l(model, spec_of(2, 4, {"q_proj", "v_proj", "down_proj"}));
  const std::vector<float> ab = random_lora(l, 13);
  save_adapter(dir.str("adapter"), l, ab.data());
  export_merged_lora(dir.str("base"), dir.str("adapter"), dir.str("out"), SaveFormat::F32);
  const PretrainedModel out = load_pretrained(dir.str("out"));
  ASSERT_TRUE(out.layout.same_as(model));
  std::vector<float> want = base;
  merge_lora(l, ab.data(), model, want.data());
  EXPECT_TRUE(same_bits(out.params.as<float>(), want.data(), want.size()));
  EXPECT_FALSE(same_bits(want.data(), base.data(), base.size()));

  // An adapter of another model is refused and nothing is written.
  const ParamLayout other(test::tiny_dense_config());
  const LoraLayout lo(other, spec_of(2, 4, {"q_proj"}));
  const std::vector<float> abo = random_lora(lo, 1);
  save_adapter(dir.str("other"), lo, abo.data());
  expect_error(
      [&] { export_merged_lora(dir.str("base"), dir.str("other"), dir.str("out2"), SaveFormat::F32); },
      {dir.str("other/adapter_model.safetensors"), "has shape"});
  EXPECT_FALSE(fs::exists(dir.str("out2")));
}

}  // namespace
}  // namespace lockstep
