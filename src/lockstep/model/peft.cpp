// The adapted projections of a model under PEFT's names (LoraLayout),
// adapter_model.safetensors written from and read into one flat f32 buffer,
// PEFT's initialisation, and the merge W + s·B·A in one documented order.
#include "lockstep/model/peft.h"

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "lockstep/base/error.h"
#include "lockstep/base/excerpt.h"
#include "lockstep/base/rng.h"
#include "lockstep/model/safetensors.h"

namespace lockstep {

namespace fs = std::filesystem;

namespace {

// PEFT's state-dict prefix: PeftModel.base_model (LoraModel).model (the
// Hugging Face model), whose own names start with "model." or "lm_head.".
constexpr const char* kPeftPrefix = "base_model.model.";
constexpr const char* kWeightSuffix = ".weight";
constexpr size_t kWeightSuffixLen = 7;  // strlen(kWeightSuffix)

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// "model.layers.0.mlp.experts.3.up_proj.weight" -> "up_proj"; "" for a name
// that is not "<...>.<module>.weight".
std::string module_of(const std::string& name) {
  if (!ends_with(name, kWeightSuffix)) return "";
  const std::string stem = name.substr(0, name.size() - kWeightSuffixLen);
  const size_t dot = stem.rfind('.');
  return dot == std::string::npos ? "" : stem.substr(dot + 1);
}

std::string shape_str(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

// FNV-1a: a stable 64-bit stream id per tensor name (as init_params keys its
// draws), so A's values do not depend on which other projections exist.
uint64_t name_hash(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char ch : s) {
    h ^= ch;
    h *= 0x100000001b3ull;
  }
  return h;
}

std::string weights_path(const std::string& dir_or_file) {
  if (ends_with(dir_or_file, ".safetensors")) return dir_or_file;
  return (fs::path(dir_or_file) / kAdapterWeightsFile).string();
}

// The tensors of one adapter file as the layout expects them, checked
// against the entry: present, a float dtype, the expected shape.
const SafetensorsEntry& expected_entry(const SafetensorsFile& f, const std::string& name,
                                       const std::vector<int64_t>& shape) {
  const SafetensorsEntry* e = f.find(name);
  if (!e)
    LS_THROW << f.path() << ": tensor '" << name
             << "' missing (adapter_config.json's r and target_modules expect it for this model)";
  if (e->dtype != "F32" && e->dtype != "BF16" && e->dtype != "F16")
    LS_THROW << f.path() << ": tensor '" << name << "' has dtype " << e->dtype
             << "; expected F32, BF16 or F16";
  if (e->shape != shape)
    LS_THROW << f.path() << ": tensor '" << name << "' has shape " << shape_str(e->shape) << ", expected "
             << shape_str(shape) << " (r and the model's shapes)";
  return *e;
}

// Rows [r0, r1) of one projection's merge (the order in peft.h).
void merge_rows(const LoraProjection& p, int64_t r, double s, const float* a, const float* b, float* w,
                int64_t r0, int64_t r1) {
  const int64_t in = p.in_features;
  std::vector<double> acc(static_cast<size_t>(in));
  for (int64_t o = r0; o < r1; ++o) {
    std::fill(acc.begin(), acc.end(), 0.0);
    for (int64_t k = 0; k < r; ++k) {
      const double bk = b[o * r + k];
      const float* a_row = a + k * in;
      for (int64_t i = 0; i < in; ++i) acc[static_cast<size_t>(i)] += bk * static_cast<double>(a_row[i]);
    }
    float* w_row = w + o * in;
    for (int64_t i = 0; i < in; ++i) {
      const double delta = s * acc[static_cast<size_t>(i)];
      if (delta != 0.0) w_row[i] = static_cast<float>(static_cast<double>(w_row[i]) + delta);
    }
  }
}

// V4's targets: the dense model's full list (what "all-linear" reads as)
// stands for V4's full list.
std::vector<std::string> v4_targets(const std::vector<std::string>& targets) {
  return targets == lora_module_names() ? lora_v4_module_names() : targets;
}

// A V4 tensor whose module name is a target but which is no adapted
// projection: the compressors' and the indexer's wkv / wq_b (f32 side paths
// that only feed the cache and the selection), and the MTP blocks' (which
// the rollout never runs).
bool v4_adapted(const ParamInfo& info, const ModelConfig& c) {
  if (info.layer < 0 || info.layer >= c.num_layers) return false;
  return info.name.find(".compressor.") == std::string::npos &&
         info.name.find(".indexer.") == std::string::npos;
}

}  // namespace

LoraLayout::LoraLayout(const ParamLayout& model, const LoraSpec& spec) : spec_(spec) {
  spec_.validate();
  const ModelConfig& c = model.config();
  if (c.is_v4()) spec_.target_modules = v4_targets(spec_.target_modules);
  const auto& family = c.is_v4() ? lora_v4_module_names() : lora_module_names();
  for (const std::string& m : spec_.target_modules)
    if (std::find(family.begin(), family.end(), m) == family.end())
      LS_THROW << "LoRA: target module \"" << m << "\" is not a projection of this "
               << (c.is_v4()
                       ? "DeepSeek-V4 model (it adapts wq_a, wkv, wq_b, wo_b, w1, w3, w2)"
                       : "model (it adapts q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj)");
  const int64_t r = spec_.rank;
  for (const ParamInfo& info : model.params()) {
    const std::string module = module_of(info.name);
    if (module.empty() || !spec_.targets(module) || info.kind != ParamKind::Matrix || info.shape.size() != 2)
      continue;
    if (c.is_v4() && !v4_adapted(info, c)) continue;
    LoraProjection p;
    p.module = module;
    p.base_name = info.name;
    const std::string stem = kPeftPrefix + info.name.substr(0, info.name.size() - kWeightSuffixLen);
    p.a_name = stem + ".lora_A.weight";
    p.b_name = stem + ".lora_B.weight";
    p.layer = info.layer;
    p.expert = info.expert;
    p.out_features = info.shape[0];
    p.in_features = info.shape[1];
    p.a_offset = numel_;
    p.b_offset = numel_ + r * p.in_features;
    numel_ = p.b_offset + p.out_features * r;
    projections_.push_back(std::move(p));
  }
  if (projections_.empty()) LS_THROW << "LoRA: the target modules match no projection of this model";
}

const LoraProjection* LoraLayout::find_base(const std::string& base_name) const {
  for (const auto& p : projections_)
    if (p.base_name == base_name) return &p;
  return nullptr;
}

void init_lora(const LoraLayout& lora, float* base, uint64_t seed) {
  const Philox rng(seed);
  const int64_t r = lora.rank();
  for (const auto& p : lora.projections()) {
    // torch's kaiming_uniform_(a = sqrt(5)), PEFT's default for A: bound 1 / sqrt(in_features).
    const float bound = static_cast<float>(1.0 / std::sqrt(static_cast<double>(p.in_features)));
    const uint64_t stream = name_hash(p.a_name);
    float* a = base + p.a_offset;
    for (int64_t j = 0; j < r * p.in_features; ++j)
      a[j] = bound * (2.0f * rng.uniform(stream, static_cast<uint64_t>(j)) - 1.0f);
    std::fill(base + p.b_offset, base + p.b_offset + p.out_features * r, 0.0f);
  }
}

void write_adapter_weights(const std::string& dir, const LoraLayout& lora, const float* base, DType dtype) {
  std::vector<SafetensorsTensor> tensors;
  const int64_t r = lora.rank();
  for (const auto& p : lora.projections()) {
    tensors.push_back({p.a_name, {r, p.in_features}, base + p.a_offset});
    tensors.push_back({p.b_name, {p.out_features, r}, base + p.b_offset});
  }
  write_safetensors(weights_path(dir), tensors, dtype);
}

void read_adapter_weights(const std::string& dir, const LoraLayout& lora, float* base) {
  const SafetensorsFile f(weights_path(dir));
  const int64_t r = lora.rank();
  size_t expected = 0;
  for (const auto& p : lora.projections()) {
    f.read_f32(expected_entry(f, p.a_name, {r, p.in_features}), base + p.a_offset);
    f.read_f32(expected_entry(f, p.b_name, {p.out_features, r}), base + p.b_offset);
    expected += 2;
  }
  if (f.entries().size() == expected) return;
  for (const auto& e : f.entries()) {
    const std::string& n = e.name;
    bool known = false;
    for (const auto& p : lora.projections()) known = known || n == p.a_name || n == p.b_name;
    if (!known)
      LS_THROW << f.path() << ": unexpected tensor '" << excerpt(n)
               << "' (not an A or B of adapter_config.json's target_modules on this model)";
  }
}

void save_adapter(const std::string& dir, const LoraLayout& lora, const float* base, DType dtype) {
  fs::create_directories(dir);
  write_adapter_weights(dir, lora, base, dtype);
  write_adapter_config(dir, lora.spec());  // last: a directory with a config has its weights
}

LoraAdapter load_adapter(const std::string& dir, const ParamLayout& model) {
  const LoraSpec spec = read_adapter_config(dir);
  LoraAdapter a;
  try {
    a.layout = LoraLayout(model, spec);
  } catch (const Error& e) {
    LS_THROW << (fs::path(dir) / kAdapterConfigFile).string() << ": " << e.what();
  }
  a.params.assign(static_cast<size_t>(a.layout.numel()), 0.0f);
  read_adapter_weights(dir, a.layout, a.params.data());
  return a;
}

void merge_lora(const LoraLayout& lora, const float* lora_base, const ParamLayout& model, float* model_base,
                const Context* ctx) {
  const int64_t r = lora.rank();
  const double s = lora.spec().scale();
  for (const auto& p : lora.projections()) {
    const ParamInfo& info = model.at(p.base_name);
    LS_CHECK(info.shape == std::vector<int64_t>({p.out_features, p.in_features}))
        << p.base_name << ": the LoRA layout was made for another model";
    const float* a = lora_base + p.a_offset;
    const float* b = lora_base + p.b_offset;
    float* w = model_base + info.offset;
    auto rows = [&](int64_t r0, int64_t r1) { merge_rows(p, r, s, a, b, w, r0, r1); };
    if (ctx)
      ctx->parallel_for(p.out_features, rows, 16);
    else
      rows(0, p.out_features);
  }
}

}  // namespace lockstep
