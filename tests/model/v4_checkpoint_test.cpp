// DeepSeek-V4 checkpoints in the official Hugging Face layout: a tiny model
// (D = 128, so the 128 x 128 FP8 blocks are real and some are cut at the
// edges) saved as bf16 and as fp8 (FP8 blocks, MXFP4 or FP8 experts) and
// loaded back; the dtype of every stored tensor; tid2eid kept exact; files
// written by hand with a missing or misshaped scale, a bad packed shape or a
// bad routing table give errors naming the tensor.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "common/test_util.h"
#include "lockstep/model/hf_quant.h"
#include "lockstep/model/pretrained.h"
#include "lockstep/model/safetensors.h"
#include "lockstep/model/weights.h"
#include "model/model_test_util.h"

namespace lockstep {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using test::expect_error;
using test::TempDir;

// Two layers (ratios 0 and 4: a window layer and a CSA layer with the
// indexer) plus one MTP block; layer 0 is hash-routed. Rq = 160 and
// H*Dh = 192 leave partial 128-blocks at the edges.
ModelConfig tiny_v4(const std::string& expert_dtype = "fp4") {
  json j = json::parse(R"({
    "architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4",
    "vocab_size": 48, "hidden_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 1, "head_dim": 48, "qk_rope_head_dim": 8, "q_lora_rank": 160,
    "o_groups": 2, "o_lora_rank": 16, "sliding_window": 8, "compress_ratios": [0, 4, 0],
    "rope_theta": 10000.0, "compress_rope_theta": 160000.0,
    "rope_scaling": {"type": "yarn", "factor": 16, "original_max_position_embeddings": 65536,
                     "beta_fast": 32, "beta_slow": 1},
    "max_position_embeddings": 4096, "index_n_heads": 2, "index_head_dim": 16, "index_topk": 4,
    "n_routed_experts": 4, "n_shared_experts": 1, "num_experts_per_tok": 2, "moe_intermediate_size": 64,
    "num_hash_layers": 1, "scoring_func": "sqrtsoftplus", "routed_scaling_factor": 1.5,
    "norm_topk_prob": true, "topk_method": "noaux_tc", "swiglu_limit": 10.0,
    "hc_mult": 2, "hc_sinkhorn_iters": 20, "hc_eps": 1e-6, "rms_norm_eps": 1e-6,
    "bos_token_id": 0, "eos_token_id": 1, "tie_word_embeddings": false,
    "num_nextn_predict_layers": 1, "hidden_act": "silu", "torch_dtype": "bfloat16"})");
  if (!expert_dtype.empty()) j["expert_dtype"] = expert_dtype;
  return model_config_from_hf_json(j, "tiny_v4");
}

struct Model {
  ModelConfig config;
  ParamLayout layout;
  Buffer params;
};

Model make_model(const std::string& expert_dtype = "fp4", uint64_t seed = 3) {
  Model m{tiny_v4(expert_dtype), {}, {}};
  m.layout = ParamLayout(m.config);
  m.params = alloc_params(m.layout);
  // A larger stddev than training's, so values spread over several binades.
  init_params(m.layout, m.params.as<float>(), seed, 0.5f);
  return m;
}

uint32_t bits_at(const float* base, int64_t k) {
  uint32_t u;
  std::memcpy(&u, base + k, 4);
  return u;
}

// The f32 values an fp8 save stores for tensor p, computed with hf_quant.
std::vector<float> fp8_expected(const ParamInfo& p, const float* src, bool mxfp4) {
  const int64_t out = p.shape[0], in = p.shape[1];
  std::vector<float> back(static_cast<size_t>(p.numel));
  if (mxfp4) {
    std::vector<uint8_t> q(static_cast<size_t>(out * in / 2)), s(static_cast<size_t>(out * in / 32));
    mxfp4_quantize(src, out, in, q.data(), s.data());
    std::vector<float> sf(s.size());
    for (size_t k = 0; k < s.size(); ++k) sf[k] = e8m0_to_f32(s[k]);
    mxfp4_dequantize(q.data(), sf.data(), out, in, back.data());
  } else {
    const auto ss = fp8_scale_shape(out, in);
    std::vector<fp8_t> q(static_cast<size_t>(out * in));
    std::vector<uint8_t> s(static_cast<size_t>(ss[0] * ss[1]));
    fp8_block_quantize(src, out, in, q.data(), s.data());
    std::vector<float> sf(s.size());
    for (size_t k = 0; k < s.size(); ++k) sf[k] = e8m0_to_f32(s[k]);
    fp8_block_dequantize(q.data(), sf.data(), out, in, back.data());
  }
  return back;
}

std::string scale_of(const std::string& weight) {
  return weight.substr(0, weight.size() - 7) + ".scale";
}

// ---- the FP8 tensor list ----

TEST(V4Checkpoint, Fp8TensorsAreTheOfficialOnes) {
  for (const char* yes :
       {"layers.0.attn.wq_a.weight", "layers.12.attn.wq_b.weight", "layers.1.attn.wkv.weight",
        "layers.1.attn.wo_a.weight", "layers.1.attn.wo_b.weight", "layers.1.attn.indexer.wq_b.weight",
        "layers.0.ffn.shared_experts.w1.weight", "layers.0.ffn.shared_experts.w2.weight",
        "layers.0.ffn.shared_experts.w3.weight", "mtp.0.e_proj.weight", "mtp.0.h_proj.weight",
        "mtp.0.attn.wq_a.weight", "mtp.0.ffn.shared_experts.w2.weight"})
    EXPECT_TRUE(fp8_checkpoint_tensor(yes)) << yes;
  for (const char* no :
       {"embed.weight", "head.weight", "norm.weight", "layers.0.e_proj.weight",
        "layers.1.attn.compressor.wkv.weight", "layers.1.attn.compressor.wgate.weight",
        "layers.1.attn.indexer.weights_proj.weight", "layers.1.attn.indexer.compressor.wkv.weight",
        "layers.0.ffn.gate.weight", "layers.0.attn.q_norm.weight", "layers.0.ffn.experts.0.w1.weight",
        "layers.x.attn.wq_a.weight", "attn.wq_a.weight", "layers.0.hc_attn_fn"})
    EXPECT_FALSE(fp8_checkpoint_tensor(no)) << no;
}

// ---- bf16 ----

TEST(V4Checkpoint, Bf16SaveKeepsF32TensorsAndTheRoutingTable) {
  TempDir dir("v4ck-bf16");
  Model m = make_model();
  const float* orig = m.params.as<float>();
  save_pretrained(dir.str("m"), m.config, m.layout, orig, SaveFormat::BF16);
  SafetensorsFile f(dir.str("m/model.safetensors"));
  int kept = 0, index = 0;
  for (const ParamInfo& p : m.layout.params()) {
    const SafetensorsEntry* e = f.find(p.name);
    ASSERT_NE(e, nullptr) << p.name;
    const char* want = p.kind == ParamKind::Index ? "I64" : p.keep_f32 ? "F32" : "BF16";
    EXPECT_EQ(e->dtype, want) << p.name;
    EXPECT_EQ(e->shape, p.shape) << p.name;
    kept += p.keep_f32;
    index += p.kind == ParamKind::Index;
  }
  EXPECT_GT(kept, 10);
  EXPECT_EQ(index, 1);
  EXPECT_EQ(f.entries().size(), m.layout.params().size()) << "no scales in a bf16 save";

  const PretrainedModel back = load_pretrained(dir.str("m"));
  EXPECT_EQ(back.config, m.config);
  ASSERT_TRUE(back.layout.same_as(m.layout));
  const float* b = back.params.as<float>();
  for (const ParamInfo& p : m.layout.params())
    for (int64_t k = p.offset; k < p.offset + p.numel; ++k) {
      const bool exact = p.keep_f32 || p.kind == ParamKind::Index;
      ASSERT_EQ(bits_at(b, k), exact ? bits_at(orig, k) : f32_bits(round_bf16(orig[k]))) << p.name;
    }
  // The routing table is the one init drew, as integers in the file.
  const ParamInfo& t = m.layout.at("layers.0.ffn.gate.tid2eid");
  std::vector<int64_t> ids(static_cast<size_t>(t.numel));
  f.read_i64(*f.find(t.name), ids.data());
  for (int64_t k = 0; k < t.numel; ++k) ASSERT_EQ(ids[size_t(k)], int32_t(bits_at(orig, t.offset + k)));
  const auto cfg = json::parse(test::read_bytes(dir.str("m/config.json")));
  EXPECT_EQ(cfg.at("torch_dtype"), "bfloat16");
  EXPECT_FALSE(cfg.contains("quantization_config"));
}

TEST(V4Checkpoint, F32SaveIsExact) {
  TempDir dir("v4ck-f32");
  Model m = make_model();
  save_params(dir.str(), m.layout, m.params.as<float>(), SaveFormat::F32);
  Buffer back = alloc_params(m.layout);
  load_params(dir.str(), m.layout, back.as<float>());
  EXPECT_EQ(std::memcmp(back.data(), m.params.data(), m.layout.nbytes()), 0);
  SafetensorsFile f(dir.str("model.safetensors"));
  EXPECT_EQ(f.find("layers.0.ffn.gate.tid2eid")->dtype, "I64");
  EXPECT_EQ(f.find("embed.weight")->dtype, "F32");
}

// ---- fp8 ----

// Checks every dtype and shape an fp8 save of m stored in dir.
void check_fp8_files(const Model& m, const std::string& dir) {
  SafetensorsCheckpoint ck(dir);
  const bool fp4 = m.config.expert_dtype == "fp4";
  std::set<std::string> named;
  std::map<std::string, int> count;  // by stored dtype
  for (const ParamInfo& p : m.layout.params()) {
    named.insert(p.name);
    const SafetensorsEntry& e = *ck.locate(p.name).entry;
    ++count[e.dtype];
    if (p.kind == ParamKind::Index) {
      EXPECT_EQ(e.dtype, "I64") << p.name;
    } else if (p.keep_f32) {
      EXPECT_EQ(e.dtype, "F32") << p.name;
    } else if (p.routed_expert() && fp4) {
      EXPECT_EQ(e.dtype, "I8") << p.name;
      EXPECT_EQ(e.shape, mxfp4_packed_shape(p.shape[0], p.shape[1])) << p.name;
      const SafetensorsEntry& s = *ck.locate(scale_of(p.name)).entry;
      EXPECT_EQ(s.dtype, "F8_E8M0") << p.name;
      EXPECT_EQ(s.shape, mxfp4_scale_shape(p.shape[0], p.shape[1])) << p.name;
      named.insert(s.name);
    } else if (p.routed_expert() || fp8_checkpoint_tensor(p.name)) {
      EXPECT_EQ(e.dtype, "F8_E4M3") << p.name;
      EXPECT_EQ(e.shape, p.shape) << p.name;
      const SafetensorsEntry& s = *ck.locate(scale_of(p.name)).entry;
      EXPECT_EQ(s.dtype, "F8_E8M0") << p.name;
      EXPECT_EQ(s.shape, fp8_scale_shape(p.shape[0], p.shape[1])) << p.name;
      named.insert(s.name);
    } else {
      EXPECT_EQ(e.dtype, "BF16") << p.name;
    }
  }
  EXPECT_EQ(ck.names().size(), named.size()) << "nothing but the layout's tensors and their scales";
  // Per block 8 FP8 projections (wq_a, wq_b, wkv, wo_a, wo_b, shared w1-w3),
  // the CSA layer's indexer wq_b, MTP e_proj and h_proj: 27; 3 x 4 x 3 experts.
  EXPECT_EQ(count["F8_E4M3"], fp4 ? 27 : 27 + 36);
  EXPECT_EQ(count["I8"], fp4 ? 36 : 0);
  EXPECT_EQ(count["I64"], 1);
}

// Whether back holds what an fp8 save of orig stores, tensor by tensor.
void check_fp8_values(const Model& m, const float* orig, const float* back) {
  const bool fp4 = m.config.expert_dtype == "fp4";
  for (const ParamInfo& p : m.layout.params()) {
    const bool quantized = p.routed_expert() || fp8_checkpoint_tensor(p.name);
    std::vector<float> want;
    if (quantized) want = fp8_expected(p, orig + p.offset, p.routed_expert() && fp4);
    for (int64_t k = 0; k < p.numel; ++k) {
      const int64_t at = p.offset + k;
      const uint32_t w = quantized                                    ? f32_bits(want[size_t(k)])
                         : (p.keep_f32 || p.kind == ParamKind::Index) ? bits_at(orig, at)
                                                                      : f32_bits(round_bf16(orig[at]));
      ASSERT_EQ(bits_at(back, at), w) << p.name << " element " << k;
    }
  }
}

TEST(V4Checkpoint, Fp8SaveStoresTheOfficialFormatsAndLoadsDequantized) {
  TempDir dir("v4ck-fp8");
  Model m = make_model("fp4");
  save_pretrained(dir.str("m"), m.config, m.layout, m.params.as<float>(), SaveFormat::FP8);
  check_fp8_files(m, dir.str("m"));
  const auto cfg = json::parse(test::read_bytes(dir.str("m/config.json")));
  EXPECT_EQ(cfg.at("quantization_config"), json::parse(R"({"quant_method": "fp8", "fmt": "e4m3",
      "scale_fmt": "ue8m0", "weight_block_size": [128, 128], "activation_scheme": "dynamic"})"));
  EXPECT_EQ(cfg.at("torch_dtype"), "bfloat16");
  EXPECT_EQ(cfg.at("expert_dtype"), "fp4");

  const PretrainedModel back = load_pretrained(dir.str("m"));
  EXPECT_EQ(back.config, m.config);
  check_fp8_values(m, m.params.as<float>(), back.params.as<float>());

  // Saving what was loaded gives the same bytes: the scales are canonical.
  save_pretrained(dir.str("again"), back.config, back.layout, back.params.as<float>(), SaveFormat::FP8);
  EXPECT_EQ(test::read_bytes(dir.str("m/model.safetensors")),
            test::read_bytes(dir.str("again/model.safetensors")));
}

TEST(V4Checkpoint, Fp8ExpertsWhenExpertDtypeIsNotFp4) {
  for (const std::string dt : {"fp8", ""}) {
    TempDir dir("v4ck-fp8e");
    Model m = make_model(dt);
    save_params(dir.str(), m.layout, m.params.as<float>(), SaveFormat::FP8);
    check_fp8_files(m, dir.str());
    EXPECT_EQ(SafetensorsFile(dir.str("model.safetensors")).find("layers.1.ffn.experts.2.w2.weight")->dtype,
              "F8_E4M3");
    Buffer back = alloc_params(m.layout);
    load_params(dir.str(), m.layout, back.as<float>());
    check_fp8_values(m, m.params.as<float>(), back.as<float>());
  }
}

// ---- the engines' packing at fp8 ----

// The MXFP4 values (hf_quant) of a (rows, cols) master tensor.
std::vector<float> mxfp4_values(const Tensor& t) {
  const int64_t out = t.shape[0], in = t.shape[1];
  std::vector<uint8_t> q(size_t(out * in / 2)), s(size_t(out * in / 32));
  mxfp4_quantize(t.f32(), out, in, q.data(), s.data());
  std::vector<float> sf(s.size()), back(size_t(out * in));
  for (size_t k = 0; k < s.size(); ++k) sf[k] = e8m0_to_f32(s[k]);
  mxfp4_dequantize(q.data(), sf.data(), out, in, back.data());
  return back;
}

// Every routed expert's projections (MTP block's included) of a bound model.
std::vector<Tensor> expert_projections(const ModelParams& p) {
  std::vector<Tensor> out;
  auto add = [&](const LayerParams& l) {
    for (const auto& e : l.experts) {
      out.push_back(e.w_gate_up);
      out.push_back(e.w_down);
    }
  };
  for (const auto& l : p.layers) add(l);
  for (const auto& m : p.mtp) add(m.block);
  return out;
}

// At fp8 storage an expert_dtype = "fp4" model's routed experts are
// multiplied by the MXFP4 values an fp8 save stores for them (as the official
// checkpoint keeps them), bit for bit; so a model loaded from such a
// checkpoint is multiplied by exactly the checkpoint's values. The other
// projections keep their 128 x 128 fp8 blocks; with expert_dtype = "fp8" or
// at bf16 the experts are packed like every other projection.
TEST(V4Checkpoint, Fp8StorageMultipliesFp4ExpertsByTheirMxfp4Values) {
  Model m = make_model("fp4");
  const model::ModelWeights w(Context{}, m.layout, m.params.as<float>(), DType::FP8E4M3, kFp8WeightBlock, {},
                              /*effective=*/true);
  ASSERT_TRUE(w.experts_mxfp4());
  EXPECT_TRUE(w.layer(0).experts[0].gate_up.mxfp4);
  EXPECT_TRUE(w.layer(2).experts[3].down.mxfp4);  // the MTP block's
  EXPECT_FALSE(w.layer(0).wq_a.mxfp4);
  EXPECT_EQ(w.layer(0).wq_a.block_n, kFp8WeightBlock);
  EXPECT_FALSE(w.layer(1).shared.down.mxfp4);
  const std::vector<Tensor> master = expert_projections(bind(m.layout, m.params.as<float>()));
  const std::vector<Tensor> used = expert_projections(w.backward_params());
  ASSERT_EQ(master.size(), 3u * 4u * 2u);
  for (size_t i = 0; i < master.size(); ++i) {
    const std::vector<float> want = mxfp4_values(master[i]);
    for (int64_t k = 0; k < master[i].numel(); ++k)
      ASSERT_EQ(f32_bits(used[i].f32()[k]), f32_bits(want[size_t(k)]))
          << "projection " << i << " element " << k;
  }

  TempDir dir("v4ck-mxfp4-pack");
  save_pretrained(dir.str("m"), m.config, m.layout, m.params.as<float>(), SaveFormat::FP8);
  PretrainedModel back = load_pretrained(dir.str("m"));
  const model::ModelWeights wb(Context{}, back.layout, back.params.as<float>(), DType::FP8E4M3,
                               kFp8WeightBlock, {}, /*effective=*/true);
  const std::vector<Tensor> loaded = expert_projections(bind(back.layout, back.params.as<float>()));
  const std::vector<Tensor> used_b = expert_projections(wb.backward_params());
  for (size_t i = 0; i < loaded.size(); ++i)
    for (int64_t k = 0; k < loaded[i].numel(); ++k)
      ASSERT_EQ(f32_bits(used_b[i].f32()[k]), f32_bits(loaded[i].f32()[k]))
          << "projection " << i << " element " << k;

  for (const std::string dt : {"fp8", ""}) {
    Model o = make_model(dt);
    const model::ModelWeights wo(Context{}, o.layout, o.params.as<float>(), DType::FP8E4M3, kFp8WeightBlock);
    EXPECT_FALSE(wo.experts_mxfp4()) << dt;
    EXPECT_FALSE(wo.layer(0).experts[0].gate_up.mxfp4) << dt;
  }
  const model::ModelWeights bf(Context{}, m.layout, m.params.as<float>(), DType::BF16);
  EXPECT_FALSE(bf.experts_mxfp4());
}

TEST(V4Checkpoint, ShardedFp8SaveLoads) {
  TempDir dir("v4ck-shards");
  Model m = make_model();
  save_params(dir.str(), m.layout, m.params.as<float>(), SaveFormat::FP8, 40'000);
  ASSERT_TRUE(fs::exists(dir.str("model.safetensors.index.json")));
  ASSERT_FALSE(fs::exists(dir.str("model.safetensors")));
  const auto idx = json::parse(test::read_bytes(dir.str("model.safetensors.index.json")));
  EXPECT_TRUE(idx["weight_map"].contains("layers.0.attn.wq_a.scale"));
  EXPECT_TRUE(idx["weight_map"].contains("layers.0.ffn.gate.tid2eid"));
  check_fp8_files(m, dir.str());
  Buffer back = alloc_params(m.layout);
  load_params(dir.str(), m.layout, back.as<float>());
  check_fp8_values(m, m.params.as<float>(), back.as<float>());
}

TEST(V4Checkpoint, ExpertParallelLayoutSkipsOtherExpertsAndTheirScales) {
  TempDir dir("v4ck-ep");
  Model m = make_model();
  save_params(dir.str(), m.layout, m.params.as<float>(), SaveFormat::FP8);
  const ParamLayout part(m.config, 1, 2);
  Buffer back = alloc_params(part);
  load_params(dir.str(), part, back.as<float>());
  const ParamInfo& p = part.at("layers.1.ffn.experts.2.w1.weight");
  const auto want = fp8_expected(p, m.params.as<float>() + m.layout.at(p.name).offset, true);
  EXPECT_EQ(std::memcmp(back.as<float>() + p.offset, want.data(), want.size() * 4), 0);
}

// Another architecture's fp8 save is DeepSeek-V3's layout: F32 weight_scale_inv,
// no ue8m0 ".scale" (tests/train/fp8_export_test.cpp checks it in full).
TEST(V4Checkpoint, Fp8SaveOfAnotherArchitectureIsTheV3Layout) {
  TempDir dir("v4ck-other");
  const ModelConfig c = test::tiny_moe_config();
  const ParamLayout layout(c);
  Buffer p = alloc_params(layout);
  init_params(layout, p.as<float>(), 3);
  save_params(dir.str(), layout, p.as<float>(), SaveFormat::FP8);
  SafetensorsFile f(dir.str("model.safetensors"));
  const std::string q = "model.layers.0.self_attn.q_proj.weight";
  ASSERT_NE(f.find(q), nullptr);
  EXPECT_EQ(f.find(q)->dtype, "F8_E4M3");
  ASSERT_NE(f.find(q + "_scale_inv"), nullptr);
  EXPECT_EQ(f.find(q + "_scale_inv")->dtype, "F32");
  EXPECT_EQ(f.find("model.layers.0.self_attn.q_proj.scale"), nullptr);
  EXPECT_EQ(f.find("model.norm.weight")->dtype, "F32");
}

// ---- files edited by hand ----

struct StoredTensor {
  std::string name, dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};

std::vector<StoredTensor> read_all(const std::string& file) {
  SafetensorsFile f(file);
  std::vector<StoredTensor> out;
  for (const SafetensorsEntry& e : f.entries()) {
    StoredTensor t{e.name, e.dtype, e.shape, std::vector<uint8_t>(e.end - e.begin)};
    f.read_bytes(e, t.bytes.data());
    out.push_back(std::move(t));
  }
  return out;
}

void write_all(const std::string& file, const std::vector<StoredTensor>& ts) {
  std::vector<SafetensorsTensor> w;
  for (const StoredTensor& t : ts) w.push_back({t.name, t.shape, nullptr, t.bytes.data(), t.dtype});
  write_safetensors(file, w, DType::F32);
}

StoredTensor& find(std::vector<StoredTensor>& ts, const std::string& name) {
  for (StoredTensor& t : ts)
    if (t.name == name) return t;
  ADD_FAILURE() << "no tensor " << name;
  return ts.front();
}

class V4CheckpointFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    m_ = make_model();
    save_params(dir_.str(), m_.layout, m_.params.as<float>(), SaveFormat::FP8);
    file_ = dir_.str("model.safetensors");
    tensors_ = read_all(file_);
  }
  // Rewrites the file after `edit` and loads it.
  void load_edited(const std::function<void(std::vector<StoredTensor>&)>& edit) {
    auto ts = tensors_;
    edit(ts);
    write_all(file_, ts);
    Buffer back = alloc_params(m_.layout);
    load_params(dir_.str(), m_.layout, back.as<float>());
    loaded_ = std::move(back);
  }

  TempDir dir_{"v4ck-edit"};
  Model m_;
  std::string file_;
  std::vector<StoredTensor> tensors_;
  Buffer loaded_;
};

TEST_F(V4CheckpointFiles, MissingScale) {
  expect_error(
      [&] {
        load_edited([](auto& ts) {
          std::erase_if(ts, [](const StoredTensor& t) { return t.name == "layers.0.attn.wq_a.scale"; });
        });
      },
      {file_, "'layers.0.attn.wq_a.weight'", "F8_E4M3", "'layers.0.attn.wq_a.scale'", "missing"});
  expect_error(
      [&] {
        load_edited([](auto& ts) {
          std::erase_if(ts,
                        [](const StoredTensor& t) { return t.name == "layers.1.ffn.experts.3.w2.scale"; });
        });
      },
      {"'layers.1.ffn.experts.3.w2.weight'", "I8", "'layers.1.ffn.experts.3.w2.scale'", "missing"});
}

TEST_F(V4CheckpointFiles, WrongScaleShapeOrDtype) {
  // wq_a is (160, 128): scales (2, 1).
  expect_error([&] { load_edited([](auto& ts) {
                       find(ts, "layers.0.attn.wq_a.scale").shape = {1, 2};
                     }); },
               {"'layers.0.attn.wq_a.scale'", "shape (1, 2)", "expected (2, 1)", "(160, 128)"});
  expect_error(
      [&] { load_edited([](auto& ts) {
              find(ts, "layers.0.ffn.experts.1.w1.scale").shape = {128, 2};
            }); },
      {"'layers.0.ffn.experts.1.w1.scale'", "shape (128, 2)", "expected (64, 4)"});
  expect_error([&] { load_edited([](auto& ts) { find(ts, "layers.0.attn.wq_a.scale").dtype = "I8"; }); },
               {"'layers.0.attn.wq_a.scale'", "dtype I8", "F8_E8M0"});
}

TEST_F(V4CheckpointFiles, BadPackedShapeOrDtype) {
  // w1 (64, 128) packs to (64, 64).
  expect_error(
      [&] { load_edited([](auto& ts) {
              find(ts, "layers.0.ffn.experts.0.w1.weight").shape = {128, 32};
            }); },
      {"'layers.0.ffn.experts.0.w1.weight'", "(128, 32)", "expected (64, 64)", "MXFP4 of (64, 128)"});
  // An FP8 weight of the wrong shape (same bytes).
  expect_error(
      [&] { load_edited([](auto& ts) {
              find(ts, "layers.0.attn.wq_a.weight").shape = {128, 160};
            }); },
      {"'layers.0.attn.wq_a.weight'", "(128, 160)", "expected (160, 128)"});
  // I8 is MXFP4 for routed experts only; a norm cannot be F8.
  expect_error(
      [&] {
        load_edited([](auto& ts) {
          auto& t = find(ts, "layers.0.attn.wq_a.weight");
          t.dtype = "I8";
        });
      },
      {"'layers.0.attn.wq_a.weight'", "dtype I8", "F8_E4M3"});
}

TEST_F(V4CheckpointFiles, F32ScalesAreAccepted) {
  // V4-Flash-Base stores expert scales as F32.
  load_edited([](auto& ts) {
    for (StoredTensor& t : ts) {
      if (t.dtype != "F8_E8M0") continue;
      std::vector<uint8_t> f(t.bytes.size() * 4);
      for (size_t k = 0; k < t.bytes.size(); ++k) {
        const float s = e8m0_to_f32(t.bytes[k]);
        std::memcpy(f.data() + 4 * k, &s, 4);
      }
      t.bytes = std::move(f);
      t.dtype = "F32";
    }
  });
  check_fp8_values(m_, m_.params.as<float>(), loaded_.as<float>());
}

TEST_F(V4CheckpointFiles, AScaleOfAnUnquantizedTensorIsUnexpected) {
  expect_error(
      [&] {
        load_edited([](auto& ts) {
          ts.push_back({"layers.0.attn_norm.scale", "F8_E8M0", {1, 1}, {127}});
          ts.push_back({"layers.0.ffn.gate.scale", "F8_E8M0", {1, 1}, {127}});
        });
      },
      {"unexpected tensors", "'layers.0.attn_norm.scale'", "'layers.0.ffn.gate.scale'"});
}

// tid2eid (48, 2) over E = 4 experts.
void set_id(StoredTensor& t, int64_t k, int64_t v) {
  if (t.dtype == "I64")
    std::memcpy(t.bytes.data() + 8 * k, &v, 8);
  else {
    const int32_t v32 = static_cast<int32_t>(v);
    std::memcpy(t.bytes.data() + 4 * k, &v32, 4);
  }
}

TEST_F(V4CheckpointFiles, RoutingTableValues) {
  const std::string name = "layers.0.ffn.gate.tid2eid";
  expect_error([&] { load_edited([&](auto& ts) { set_id(find(ts, name), 2 * 7 + 1, 4); }); },
               {file_, "'" + name + "'", "row 7", "expert 4", "[0, 4)"});
  expect_error([&] { load_edited([&](auto& ts) { set_id(find(ts, name), 2 * 9, -1); }); },
               {"'" + name + "'", "row 9", "expert -1"});
  expect_error(
      [&] {
        load_edited([&](auto& ts) {
          set_id(find(ts, name), 2 * 3, 1);
          set_id(find(ts, name), 2 * 3 + 1, 1);
        });
      },
      {"'" + name + "'", "row 3", "twice"});
}

TEST_F(V4CheckpointFiles, RoutingTableDtypes) {
  const std::string name = "layers.0.ffn.gate.tid2eid";
  // I32 is read as it is.
  load_edited([&](auto& ts) {
    StoredTensor& t = find(ts, name);
    std::vector<uint8_t> b(t.bytes.size() / 2);
    for (size_t k = 0; k < b.size() / 4; ++k) std::memcpy(b.data() + 4 * k, t.bytes.data() + 8 * k, 4);
    t.bytes = std::move(b);
    t.dtype = "I32";
  });
  const ParamInfo& p = m_.layout.at(name);
  EXPECT_EQ(std::memcmp(loaded_.as<float>() + p.offset, m_.params.as<float>() + p.offset, p.numel * 4), 0);
  // A float table is refused, whatever its values.
  expect_error(
      [&] {
        load_edited([&](auto& ts) {
          StoredTensor& t = find(ts, name);
          t.bytes.resize(t.bytes.size() / 2);
          t.dtype = "F32";
        });
      },
      {"'" + name + "'", "integer table", "F32", "I64 or I32"});
  expect_error(
      [&] {
        load_edited([&](auto& ts) {
          StoredTensor& t = find(ts, name);
          t.shape = {2, 48};
        });
      },
      {"'" + name + "'", "(2, 48)", "expected (48, 2)"});
}

}  // namespace
}  // namespace lockstep
