// The [lora] config, the adapters' layout (PEFT names over one flat buffer),
// PEFT's initialisation, and the adapters' forward and backward products.
#include "lockstep/model/lora.h"

#include <algorithm>
#include <cmath>

#include "lockstep/base/error.h"
#include "lockstep/base/rng.h"
#include "lockstep/kernels/cpu/gemm.h"

namespace lockstep::model {

namespace {

// PEFT's module names in the canonical order (the order of ParamLayout).
const std::vector<std::string>& all_modules() {
  static const std::vector<std::string> kAll = {"q_proj",    "k_proj",  "v_proj",   "o_proj",
                                                "gate_proj", "up_proj", "down_proj"};
  return kAll;
}

// FNV-1a of a PEFT name: A's Philox stream.
uint64_t name_stream(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char ch : s) {
    h ^= ch;
    h *= 0x100000001b3ull;
  }
  return h;
}

// The PEFT module of a base parameter name ("...q_proj.weight" -> "q_proj"),
// or "" for a tensor no adapter may target (norms, router, LM head, ...).
std::string module_of(const ParamInfo& p) {
  if (p.kind != ParamKind::Matrix || p.layer < 0) return "";
  const std::string suffix = ".weight";
  if (p.name.size() <= suffix.size() ||
      p.name.compare(p.name.size() - suffix.size(), suffix.size(), suffix) != 0)
    return "";
  const std::string stem = p.name.substr(0, p.name.size() - suffix.size());
  const size_t dot = stem.rfind('.');
  const std::string leaf = dot == std::string::npos ? stem : stem.substr(dot + 1);
  const auto& all = all_modules();
  return std::find(all.begin(), all.end(), leaf) != all.end() ? leaf : "";
}

LoraPair& slot_of(LoraLayer& L, const LoraTensorInfo& t, const std::string& module, int64_t expert) {
  LoraMlp* mlp = &L.mlp;
  if (expert >= 0)
    mlp = &L.experts[size_t(expert)];
  else if (t.base.find("shared_expert") != std::string::npos)
    mlp = &L.shared;
  if (module == "q_proj") return L.q;
  if (module == "k_proj") return L.k;
  if (module == "v_proj") return L.v;
  if (module == "o_proj") return L.o;
  if (module == "gate_proj") return mlp->gate;
  if (module == "up_proj") return mlp->up;
  return mlp->down;
}

}  // namespace

std::vector<std::string> LoraConfig::modules() const {
  if (target_modules.size() == 1 && target_modules[0] == "all-linear") return all_modules();
  std::vector<std::string> out;
  for (const std::string& m : all_modules())
    if (std::find(target_modules.begin(), target_modules.end(), m) != target_modules.end()) out.push_back(m);
  return out;
}

LoraConfig lora_config_from_toml(TomlSection& s) {
  LoraConfig c;
  c.rank = s.get_int("rank", 0, 0, 4096);
  c.alpha = s.get_double("alpha", c.alpha, 1e-12, 1e12);
  const double dropout = s.get_double("dropout", 0.0, 0.0, 1.0);
  if (dropout != 0.0)
    s.fail("dropout",
           "only 0 is supported: a dropout mask would make the trainer's forward differ from the rollout's, "
           "and lockstep's engines must agree bit for bit");
  c.target_modules = s.get_string_list("target_modules", c.target_modules);
  c.init_seed = static_cast<uint64_t>(s.get_int("init_seed", 0, 0));
  if (c.target_modules.empty()) s.fail("target_modules", "is empty: name at least one module");
  const auto& all = all_modules();
  for (const std::string& m : c.target_modules) {
    if (m == "all-linear") {
      if (c.target_modules.size() != 1) s.fail("target_modules", "\"all-linear\" must be the only entry");
      continue;
    }
    if (std::find(all.begin(), all.end(), m) == all.end())
      s.fail("target_modules",
             "unknown module \"" + m +
                 "\" (expected q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj "
                 "or \"all-linear\")");
  }
  return c;
}

LoraLayout::LoraLayout(const ParamLayout& base, const LoraConfig& config) : config_(config) {
  const ModelConfig& c = base.config();
  if (c.is_v4()) LS_THROW << "[lora]: LoRA adapters are not supported for DeepSeek-V4 models";
  if (config.rank <= 0) LS_THROW << "[lora] rank: must be > 0 for a LoRA layout, got " << config.rank;
  if (!base.all_experts())
    LS_THROW << "[lora]: LoRA needs a layout holding every expert (no expert parallelism)";
  num_layers_ = c.num_layers;
  num_experts_ = c.num_experts;
  const std::vector<std::string> wanted = config.modules();
  const int64_t r = config.rank;
  for (const ParamInfo& p : base.params()) {
    const std::string module = module_of(p);
    if (module.empty() || std::find(wanted.begin(), wanted.end(), module) == wanted.end()) continue;
    const std::string stem = "base_model.model." + p.name.substr(0, p.name.size() - 7);  // drop ".weight"
    const int64_t out = p.shape[0], in = p.shape[1];
    LoraTensorInfo a{stem + ".lora_A.weight", p.name, {r, in}, numel_, r * in, true};
    numel_ += a.numel;
    LoraTensorInfo b{stem + ".lora_B.weight", p.name, {out, r}, numel_, out * r, false};
    numel_ += b.numel;
    tensors_.push_back(std::move(a));
    tensors_.push_back(std::move(b));
  }
  if (tensors_.empty()) LS_THROW << "[lora] target_modules: no projection of this model matches";
}

LoraParams LoraLayout::bind(float* base) const {
  LoraParams m;
  m.layers.resize(size_t(num_layers_));
  for (LoraLayer& L : m.layers) L.experts.resize(size_t(num_experts_));
  // The base layout's entries give each tensor's layer and expert.
  for (size_t i = 0; i < tensors_.size(); i += 2) {
    const LoraTensorInfo &a = tensors_[i], &b = tensors_[i + 1];
    // "model.layers.<l>.": the layer; "experts.<e>.": the expert.
    const std::string& n = a.base;
    const int64_t layer = std::stoll(n.substr(13));
    const size_t ex = n.find(".experts.");
    const int64_t expert = ex == std::string::npos ? -1 : std::stoll(n.substr(ex + 9));
    const std::string leaf = n.substr(0, n.size() - 7);
    const std::string module = leaf.substr(leaf.rfind('.') + 1);
    LoraPair& pair = slot_of(m.layers[size_t(layer)], a, module, expert);
    pair.a = Tensor(base + a.offset, DType::F32, {a.shape[0], a.shape[1]});
    pair.b = Tensor(base + b.offset, DType::F32, {b.shape[0], b.shape[1]});
  }
  return m;
}

void init_lora(const LoraLayout& layout, float* base, uint64_t seed) {
  const Philox rng(seed);
  for (const LoraTensorInfo& t : layout.tensors()) {
    float* dst = base + t.offset;
    if (!t.is_a) {
      std::fill(dst, dst + t.numel, 0.0f);
      continue;
    }
    const double bound = 1.0 / std::sqrt(double(t.shape[1]));
    const uint64_t stream = name_stream(t.name);
    for (int64_t j = 0; j < t.numel; ++j)
      dst[j] = static_cast<float>((2.0 * rng.uniform_double(stream, uint64_t(j)) - 1.0) * bound);
  }
}

namespace {
// us (T, r) = s·(x·Aᵀ): the chain over `in`, then one f32 multiply each.
OwnedTensor scaled_down(const Context& ctx, const Tensor& x, const LoraPair& p, float s) {
  const int64_t T = x.dim(0), r = p.a.dim(0);
  OwnedTensor us(DType::F32, {T, r});  // (T, r)
  if (T == 0) return us;
  kernels::gemm_xwt(ctx, us.view(), x, p.a);
  float* u = us.f32();
  for (int64_t i = 0; i < T * r; ++i) u[i] = u[i] * s;
  return us;
}
}  // namespace

void lora_forward(const Context& ctx, Tensor y, const Tensor& x, const LoraPair& p, float s) {
  if (!p.on() || x.dim(0) == 0) return;
  const OwnedTensor us = scaled_down(ctx, x, p, s);
  kernels::gemm_xwt(ctx, y, us.view(), p.b, true);
}

void lora_backward(const Context& ctx, Tensor dx, const Tensor& dy, const Tensor& x, const LoraPair& p,
                   const LoraPair& g, float s) {
  if (!p.on() || x.dim(0) == 0) return;
  const int64_t T = x.dim(0), r = p.a.dim(0);
  // du (T, r) = s·(dy·B): the gradient of the scaled down-projection.
  OwnedTensor du(DType::F32, {T, r});
  kernels::gemm_dyw(ctx, du.view(), dy, p.b);
  float* d = du.f32();
  for (int64_t i = 0; i < T * r; ++i) d[i] = d[i] * s;
  if (g.b.data != nullptr) kernels::gemm_dytx(ctx, g.b, dy, scaled_down(ctx, x, p, s).view());
  if (g.a.data != nullptr) kernels::gemm_dytx(ctx, g.a, du.view(), x);
  if (dx.data != nullptr) kernels::gemm_dyw(ctx, dx, du.view(), p.a, true);
}

ModelParams frozen_base_grads(const ParamLayout& layout, Buffer& scratch) {
  const ModelConfig& c = layout.config();
  const int64_t D = c.hidden_size, Dh = c.head_dim;
  scratch = Buffer(size_t(std::max(D, Dh)) * sizeof(float));
  float* s = scratch.as<float>();
  ModelParams m;
  m.final_norm = Tensor(s, DType::F32, {D});
  m.layers.resize(size_t(c.num_layers));
  for (LayerParams& L : m.layers) {
    L.attn_norm = Tensor(s, DType::F32, {D});
    L.mlp_norm = Tensor(s, DType::F32, {D});
    if (c.qk_norm) {
      L.q_norm = Tensor(s, DType::F32, {Dh});
      L.k_norm = Tensor(s, DType::F32, {Dh});
    }
    L.experts.resize(size_t(c.num_experts));
  }
  return m;
}

}  // namespace lockstep::model
