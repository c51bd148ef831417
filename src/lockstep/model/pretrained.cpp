// Flat parameter buffers <-> safetensors by Hugging Face name, and the
// save_pretrained / load_pretrained directory helpers (staged, then swapped in).
#include "lockstep/model/pretrained.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "lockstep/base/error.h"
#include "lockstep/base/excerpt.h"
#include "lockstep/base/file_util.h"
#include "lockstep/kernels/gpu/backend.h"
#include "lockstep/model/hf_quant.h"
#include "lockstep/model/safetensors.h"

namespace lockstep {

namespace fs = std::filesystem;

namespace {

std::string shape_string(const std::vector<int64_t>& s) {
  std::string out = "(";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + (s.size() == 1 ? ",)" : ")");
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Checkpoint tensors that are not parameters of the layout but harmless.
bool tolerated_extra(const std::string& name, const ModelConfig& c) {
  if (name == "lm_head.weight" && c.tie_word_embeddings) return true;  // tied: the embedding is used
  return ends_with(name, ".rotary_emb.inv_freq");                      // old Llama checkpoints store it
}

// Files save_pretrained writes itself; an old copy must not be carried over.
bool written_by_save(const std::string& name) {
  return name == "config.json" || name == "model.safetensors" || name == "model.safetensors.index.json" ||
         is_shard_file_name(name);
}

std::atomic<uint64_t> g_stage_counter{0};

// A block tensor's name without its "layers.i." or "mtp.j." prefix (*mtp
// says which); "" for a name outside the blocks.
std::string block_key(const std::string& name, bool* mtp) {
  *mtp = false;
  for (const std::string prefix : {"layers.", "mtp."}) {
    if (name.compare(0, prefix.size(), prefix) != 0) continue;
    size_t k = prefix.size();
    while (k < name.size() && name[k] >= '0' && name[k] <= '9') ++k;
    if (k == prefix.size() || k >= name.size() || name[k] != '.') return "";
    *mtp = prefix == "mtp.";
    return name.substr(k + 1);
  }
  return "";
}

// The scale tensor of a quantized "X.weight": "X.scale" (DeepSeek-V4), or
// "X.weight_scale_inv" (DeepSeek-V3 and the FP8 checkpoints vLLM reads).
std::string scale_name(const std::string& weight) {
  return (ends_with(weight, ".weight") ? weight.substr(0, weight.size() - 7) : weight) + ".scale";
}
std::string scale_inv_name(const std::string& weight) {
  return weight + "_scale_inv";
}

// The dtype of a save's plain float tensors: an FP8 save of another
// architecture than DeepSeek-V4 keeps them F32, so nothing but the fp8
// projections is rounded (the export loads back bit for bit).
DType float_dtype_of(SaveFormat format, const ModelConfig& c) {
  if (format == SaveFormat::F32 || (format == SaveFormat::FP8 && !c.is_v4())) return DType::F32;
  return DType::BF16;
}

// config.json for a save in `format`: an FP8 save records its storage as the
// official release does (activations are quantized on the fly: "dynamic";
// DeepSeek-V4 stores ue8m0 scales, the others f32 "weight_scale_inv");
// another save has no quantization_config, whatever the config says.
void write_config_json(const std::string& path, const ModelConfig& c, SaveFormat format) {
  nlohmann::json j = model_config_to_hf_json(c, float_dtype_of(format, c));
  j.erase("quantization_config");
  if (format == SaveFormat::FP8) {
    nlohmann::json q = {{"quant_method", "fp8"},
                        {"fmt", "e4m3"},
                        {"weight_block_size", {kFp8WeightBlock, kFp8WeightBlock}},
                        {"activation_scheme", "dynamic"}};
    if (c.is_v4()) q["scale_fmt"] = "ue8m0";
    j["quantization_config"] = q;
  }
  write_file_atomic(path, j.dump(2) + "\n");
}

SaveFormat save_format_of(DType dtype, const std::string& dir) {
  if (dtype == DType::F32) return SaveFormat::F32;
  if (dtype == DType::BF16) return SaveFormat::BF16;
  LS_THROW << dir << ": safetensors are written as F32 or BF16, not " << dtype_name(dtype);
}

}  // namespace

const char* save_format_name(SaveFormat f) {
  switch (f) {
    case SaveFormat::F32: return "f32";
    case SaveFormat::BF16: return "bf16";
    case SaveFormat::FP8: return "fp8";
  }
  return "?";
}

bool fp8_checkpoint_tensor(const std::string& name) {
  static const std::set<std::string> kBlockTensors = {"attn.wq_a.weight",
                                                      "attn.wq_b.weight",
                                                      "attn.wkv.weight",
                                                      "attn.wo_a.weight",
                                                      "attn.wo_b.weight",
                                                      "attn.indexer.wq_b.weight",
                                                      "ffn.shared_experts.w1.weight",
                                                      "ffn.shared_experts.w2.weight",
                                                      "ffn.shared_experts.w3.weight"};
  static const std::set<std::string> kMtpTensors = {"e_proj.weight", "h_proj.weight"};
  bool mtp = false;
  const std::string key = block_key(name, &mtp);
  return kBlockTensors.count(key) != 0 || (mtp && kMtpTensors.count(key) != 0);
}

namespace {

// How one layout tensor is stored in a checkpoint.
enum class Storage {
  Float,      // the writer's F32 or BF16, or any float dtype on load
  F32,        // keep_f32: F32 whatever the format
  Index,      // I64 on save; I64 or I32 on load
  Fp8,        // F8_E4M3 + ue8m0 128 x 128 block scales
  Mxfp4,      // I8 (two e2m1 per byte) + ue8m0 1 x 32 scales
  Fp8Inv,     // F8_E4M3 + F32 128 x 128 block scales "X.weight_scale_inv"
  Fp8Values,  // F32: the values of Fp8Inv (an lm_head that serving engines keep unquantized)
};

// Outside DeepSeek-V4: a projection ModelWeights packs in the storage
// precision (attention, MLP, expert and shared-expert *_proj weights; not
// the router, the shared-expert gate or the LM head).
bool fp8_projection(const ParamInfo& p) {
  return p.layer >= 0 && p.shape.size() == 2 && ends_with(p.name, "_proj.weight");
}

Storage save_storage(const ParamInfo& p, const ModelConfig& c, SaveFormat format) {
  if (p.kind == ParamKind::Index) return Storage::Index;
  if (p.keep_f32) return Storage::F32;
  if (format != SaveFormat::FP8) return Storage::Float;
  if (!c.is_v4()) {
    if (fp8_projection(p)) return Storage::Fp8Inv;
    return p.name == "lm_head.weight" ? Storage::Fp8Values : Storage::Float;
  }
  if (p.routed_expert()) return c.expert_dtype == "fp4" ? Storage::Mxfp4 : Storage::Fp8;
  return fp8_checkpoint_tensor(p.name) ? Storage::Fp8 : Storage::Float;
}

// The bytes save_params writes for one tensor that is not plain f32 values.
struct Encoded {
  Storage storage = Storage::Float;
  std::vector<uint8_t> data, scale;  // Fp8 / Mxfp4 / Fp8Inv: codes and ue8m0 scales
  std::vector<float> values;         // Fp8Inv: the f32 scales; Fp8Values: the values
  std::vector<int64_t> ids;          // Index
};

// Fp8Inv and Fp8Values: fp8 blocks (the rule of pack_weight), then the
// scales as f32, or the dequantized values.
void encode_fp8_f32(const ParamInfo& p, const float* src, Encoded& e) {
  const int64_t out = p.shape[0], in = p.shape[1];
  const auto ss = fp8_scale_shape(out, in);
  e.data.resize(static_cast<size_t>(out * in));
  e.scale.resize(static_cast<size_t>(ss[0] * ss[1]));
  fp8_block_quantize(src, out, in, e.data.data(), e.scale.data(), p.name);
  std::vector<float> scale(e.scale.size());
  for (size_t i = 0; i < scale.size(); ++i) scale[i] = e8m0_to_f32(e.scale[i]);
  if (e.storage == Storage::Fp8Inv) {
    e.values = std::move(scale);
    return;
  }
  e.values.resize(e.data.size());
  fp8_block_dequantize(e.data.data(), scale.data(), out, in, e.values.data());
  e.data.clear();
}

Encoded encode_param(const ParamInfo& p, const float* src, const ModelConfig& c, SaveFormat format) {
  Encoded e;
  e.storage = save_storage(p, c, format);
  if (e.storage == Storage::Index) {
    e.ids.resize(static_cast<size_t>(p.numel));
    for (size_t k = 0; k < e.ids.size(); ++k) {
      int32_t v;
      std::memcpy(&v, src + k, 4);  // int32 bit patterns, never a float value
      e.ids[k] = v;
    }
  } else if (e.storage == Storage::Fp8Inv || e.storage == Storage::Fp8Values) {
    if (p.shape.size() != 2) LS_THROW << "tensor '" << p.name << "': only 2-D weights are quantized";
    encode_fp8_f32(p, src, e);
  } else if (e.storage == Storage::Fp8 || e.storage == Storage::Mxfp4) {
    if (p.shape.size() != 2) LS_THROW << "tensor '" << p.name << "': only 2-D weights are quantized";
    const int64_t out = p.shape[0], in = p.shape[1];
    const bool fp8 = e.storage == Storage::Fp8;
    const auto ss = fp8 ? fp8_scale_shape(out, in) : mxfp4_scale_shape(out, in);
    e.data.resize(static_cast<size_t>(fp8 ? out * in : out * in / 2));
    e.scale.resize(static_cast<size_t>(ss[0] * ss[1]));
    if (fp8)
      fp8_block_quantize(src, out, in, e.data.data(), e.scale.data(), p.name);
    else
      mxfp4_quantize(src, out, in, e.data.data(), e.scale.data(), p.name);
  }
  return e;
}

}  // namespace

void save_params(const std::string& dir, const ParamLayout& layout, const float* base, SaveFormat format,
                 uint64_t max_shard_bytes, const Context* ctx) {
  const ModelConfig& c = layout.config();
  const auto& params = layout.params();
  std::vector<Encoded> enc(params.size());
  auto encode = [&](int64_t i0, int64_t i1) {
    std::vector<unsigned char> keep;
    for (int64_t i = i0; i < i1; ++i) {
      const ParamInfo& p = params[static_cast<size_t>(i)];
      // A copy where the parameters lie in device memory (a trainer on a device).
      const Tensor values =
          kernels::host_readable(Tensor(const_cast<float*>(base + p.offset), DType::F32, {p.numel}), keep);
      enc[static_cast<size_t>(i)] = encode_param(p, values.f32(), c, format);
    }
  };
  const int64_t n = static_cast<int64_t>(params.size());
  if (ctx)
    ctx->parallel_for(n, encode);
  else
    encode(0, n);

  std::vector<SafetensorsTensor> tensors;
  tensors.reserve(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    const ParamInfo& p = params[i];
    const Encoded& e = enc[i];
    switch (e.storage) {
      case Storage::Float: tensors.push_back({p.name, p.shape, base + p.offset}); break;
      case Storage::F32: tensors.push_back({p.name, p.shape, nullptr, base + p.offset, "F32"}); break;
      case Storage::Index: tensors.push_back({p.name, p.shape, nullptr, e.ids.data(), "I64"}); break;
      case Storage::Fp8Values: tensors.push_back({p.name, p.shape, nullptr, e.values.data(), "F32"}); break;
      case Storage::Fp8Inv:
        tensors.push_back({p.name, p.shape, nullptr, e.data.data(), "F8_E4M3"});
        tensors.push_back({scale_inv_name(p.name), fp8_scale_shape(p.shape[0], p.shape[1]), nullptr,
                           e.values.data(), "F32"});
        break;
      case Storage::Fp8:
      case Storage::Mxfp4: {
        const int64_t out = p.shape[0], in = p.shape[1];
        const bool fp8 = e.storage == Storage::Fp8;
        tensors.push_back({p.name, fp8 ? p.shape : mxfp4_packed_shape(out, in), nullptr, e.data.data(),
                           fp8 ? "F8_E4M3" : "I8"});
        tensors.push_back({scale_name(p.name), fp8 ? fp8_scale_shape(out, in) : mxfp4_scale_shape(out, in),
                           nullptr, e.scale.data(), "F8_E8M0"});
        break;
      }
    }
  }
  write_safetensors_sharded(dir, tensors, float_dtype_of(format, c), max_shard_bytes);
}

void save_params(const std::string& dir, const ParamLayout& layout, const float* base, DType dtype,
                 uint64_t max_shard_bytes) {
  save_params(dir, layout, base, save_format_of(dtype, dir), max_shard_bytes);
}

namespace {

// A routed expert's tensor that a layout of some experts only (expert
// parallelism) leaves to another rank (its scale included).
bool other_rank_expert(const std::string& name, const ParamLayout& layout) {
  return !layout.all_experts() &&
         (name.find(".mlp.experts.") != std::string::npos || name.find(".ffn.experts.") != std::string::npos);
}

bool is_float_dtype(const std::string& dt) {
  return dt == "F32" || dt == "BF16" || dt == "F16";
}

// Where one layout tensor comes from, checked before anything is written.
struct LoadPlan {
  Storage storage = Storage::Float;
  SafetensorsCheckpoint::Located data{}, scale{};
  std::vector<int32_t> ids;  // Index: the validated table
};

// "X.scale" of a quantized weight: present, a float scale dtype, shape `want`.
SafetensorsCheckpoint::Located locate_scale(const SafetensorsCheckpoint& ckpt, const ParamInfo& p,
                                            const SafetensorsCheckpoint::Located& w,
                                            const std::vector<int64_t>& want) {
  std::string sn = scale_name(p.name);
  if (!ckpt.contains(sn) && ckpt.contains(scale_inv_name(p.name))) sn = scale_inv_name(p.name);
  if (!ckpt.contains(sn))
    LS_THROW << w.file->path() << ": tensor '" << p.name << "' is " << w.entry->dtype << " but its scale '"
             << sn << "' (or '" << scale_inv_name(p.name) << "') is missing";
  auto s = ckpt.locate(sn);
  if (s.entry->dtype != "F8_E8M0" && !is_float_dtype(s.entry->dtype))
    LS_THROW << s.file->path() << ": scale '" << sn << "' has dtype " << s.entry->dtype
             << ", expected F8_E8M0 (or F32, BF16, F16)";
  if (s.entry->shape != want)
    LS_THROW << s.file->path() << ": scale '" << sn << "' has shape " << shape_string(s.entry->shape)
             << ", expected " << shape_string(want) << " for '" << p.name << "' of shape "
             << shape_string(p.shape);
  return s;
}

// An Index table: I64 or I32, values in [0, E), each row's values distinct.
std::vector<int32_t> read_index_table(const SafetensorsCheckpoint::Located& w, const ParamInfo& p,
                                      int64_t E) {
  const std::string& path = w.file->path();
  if (w.entry->dtype != "I64" && w.entry->dtype != "I32")
    LS_THROW << path << ": tensor '" << p.name << "' is an integer table stored as " << w.entry->dtype
             << "; expected I64 or I32";
  std::vector<int64_t> v(static_cast<size_t>(w.entry->numel));
  w.file->read_i64(*w.entry, v.data());
  const int64_t K = p.shape.size() == 2 ? p.shape[1] : p.numel;
  std::vector<int32_t> ids(v.size());
  for (int64_t r = 0; K > 0 && r < p.numel / K; ++r)
    for (int64_t k = 0; k < K; ++k) {
      const int64_t x = v[static_cast<size_t>(r * K + k)];
      if (x < 0 || x >= E)
        LS_THROW << path << ": tensor '" << p.name << "' row " << r << " holds expert " << x
                 << ", outside [0, " << E << ")";
      for (int64_t k2 = 0; k2 < k; ++k2)
        if (v[static_cast<size_t>(r * K + k2)] == x)
          LS_THROW << path << ": tensor '" << p.name << "' row " << r << " names expert " << x << " twice";
      ids[static_cast<size_t>(r * K + k)] = static_cast<int32_t>(x);
    }
  return ids;
}

[[noreturn]] void throw_shape(const SafetensorsCheckpoint::Located& w, const ParamInfo& p,
                              const std::vector<int64_t>& want, const char* how) {
  LS_THROW << w.file->path() << ": tensor '" << p.name << "' has shape " << shape_string(w.entry->shape)
           << ", expected " << shape_string(want) << how;
}

LoadPlan plan_param(const SafetensorsCheckpoint& ckpt, const ParamInfo& p, const ModelConfig& c) {
  if (!ckpt.contains(p.name)) LS_THROW << ckpt.source() << ": missing tensor '" << p.name << "'";
  LoadPlan plan;
  plan.data = ckpt.locate(p.name);
  const SafetensorsEntry& e = *plan.data.entry;
  const std::string& path = plan.data.file->path();
  if (p.kind == ParamKind::Index) {
    if (e.shape != p.shape) throw_shape(plan.data, p, p.shape, "");
    plan.storage = Storage::Index;
    plan.ids = read_index_table(plan.data, p, c.num_experts);
    return plan;
  }
  if (is_float_dtype(e.dtype)) {
    if (e.shape != p.shape) throw_shape(plan.data, p, p.shape, "");
    return plan;
  }
  const bool weight = p.shape.size() == 2 && ends_with(p.name, ".weight");
  if (e.dtype == "F8_E4M3" && weight) {
    if (e.shape != p.shape) throw_shape(plan.data, p, p.shape, "");
    plan.storage = Storage::Fp8;
    plan.scale = locate_scale(ckpt, p, plan.data, fp8_scale_shape(p.shape[0], p.shape[1]));
    return plan;
  }
  if (e.dtype == "I8" && weight && p.routed_expert()) {
    const int64_t out = p.shape[0], in = p.shape[1];
    if (in % kMxfp4Group != 0)
      LS_THROW << path << ": tensor '" << p.name << "' is I8 (MXFP4), but its width " << in
               << " is not a multiple of " << kMxfp4Group;
    const auto packed = mxfp4_packed_shape(out, in);
    if (e.shape != packed)
      throw_shape(plan.data, p, packed, (" (MXFP4 of " + shape_string(p.shape) + ")").c_str());
    plan.storage = Storage::Mxfp4;
    plan.scale = locate_scale(ckpt, p, plan.data, mxfp4_scale_shape(out, in));
    return plan;
  }
  LS_THROW << path << ": tensor '" << p.name << "' has dtype " << e.dtype << "; expected F32, BF16 or F16"
           << (weight ? ", or F8_E4M3 with a '.scale'" : "")
           << (weight && p.routed_expert() ? ", or I8 (MXFP4) with a '.scale'" : "");
}

// Checkpoint tensors that the layout does not name and nothing explains.
std::vector<std::string> unexpected_tensors(const SafetensorsCheckpoint& ckpt, const ParamLayout& layout) {
  std::vector<std::string> extras;
  for (const std::string& name : ckpt.names()) {
    if (layout.find(name) || tolerated_extra(name, layout.config()) || other_rank_expert(name, layout))
      continue;
    // The scale of a quantized weight (anything else named so is an extra).
    std::string w;
    if (ends_with(name, ".scale")) w = name.substr(0, name.size() - 6) + ".weight";
    if (ends_with(name, ".weight_scale_inv")) w = name.substr(0, name.size() - 10);
    if (!w.empty() && layout.find(w) && ckpt.contains(w) && !is_float_dtype(ckpt.locate(w).entry->dtype))
      continue;
    extras.push_back(name);
  }
  return extras;
}

void load_planned(const LoadPlan& plan, const ParamInfo& p, float* dst) {
  const SafetensorsFile& f = *plan.data.file;
  switch (plan.storage) {
    case Storage::Float:
    case Storage::F32: f.read_f32(*plan.data.entry, dst); return;
    case Storage::Index: std::memcpy(dst, plan.ids.data(), plan.ids.size() * 4); return;
    case Storage::Fp8Inv:
    case Storage::Fp8Values: LS_CHECK(false) << "save-only storage for '" << p.name << "'"; return;
    case Storage::Fp8:
    case Storage::Mxfp4: {
      std::vector<float> scale(static_cast<size_t>(plan.scale.entry->numel));
      plan.scale.file->read_f32(*plan.scale.entry, scale.data());
      f.verify(*plan.data.entry);
      const uint8_t* q = f.data(*plan.data.entry);  // bytes: no alignment needed
      if (plan.storage == Storage::Fp8)
        fp8_block_dequantize(q, scale.data(), p.shape[0], p.shape[1], dst);
      else
        mxfp4_dequantize(q, scale.data(), p.shape[0], p.shape[1], dst, p.name);
      return;
    }
  }
}

}  // namespace

void load_params(const std::string& path, const ParamLayout& layout, float* base, const Context* ctx) {
  SafetensorsCheckpoint ckpt(path);
  const ModelConfig& c = layout.config();
  // Check names, shapes, dtypes and index tables first: fail before touching the buffer.
  const std::vector<std::string> extras = unexpected_tensors(ckpt, layout);
  if (!extras.empty()) {
    std::ostringstream os;
    for (size_t i = 0; i < extras.size() && i < 5; ++i)
      os << (i ? ", " : "") << "'" << excerpt(extras[i]) << "'";
    if (extras.size() > 5) os << " and " << extras.size() - 5 << " more";
    LS_THROW << ckpt.source() << ": unexpected tensor" << (extras.size() > 1 ? "s " : " ") << os.str()
             << ", which the config (" << architecture_name(c.architecture)
             << ") does not have: the checkpoint and config.json describe different models";
  }
  const auto& params = layout.params();
  std::vector<LoadPlan> plans;
  plans.reserve(params.size());
  for (const ParamInfo& p : params) plans.push_back(plan_param(ckpt, p, c));
  auto load = [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const ParamInfo& p = params[static_cast<size_t>(i)];
      load_planned(plans[static_cast<size_t>(i)], p, base + p.offset);
    }
  };
  const int64_t n = static_cast<int64_t>(params.size());
  if (ctx)
    ctx->parallel_for(n, load);
  else
    load(0, n);
}

void save_pretrained(const std::string& dir, const ModelConfig& config, const ParamLayout& layout,
                     const float* base, DType dtype, uint64_t max_shard_bytes) {
  save_pretrained(dir, config, layout, base, save_format_of(dtype, dir), max_shard_bytes);
}

void save_pretrained(const std::string& dir, const ModelConfig& config, const ParamLayout& layout,
                     const float* base, SaveFormat format, uint64_t max_shard_bytes) {
  if (!layout.same_as(ParamLayout(config)))
    LS_THROW << dir << ": save_pretrained: the parameter layout does not match the config";
  fs::path target = fs::path(dir).lexically_normal();
  if (target.filename().empty()) target = target.parent_path();  // "a/b/" -> "a/b"
  if (target.empty()) LS_THROW << "save_pretrained: empty directory name";
  fs::path parent = target.parent_path();
  if (parent.empty()) parent = ".";
  std::error_code ec;
  fs::create_directories(parent, ec);
  if (fs::exists(target) && !fs::is_directory(target)) LS_THROW << dir << ": exists and is not a directory";

  // Hidden sibling names: ".<dir>.tmp-<pid>-<n>" (same filesystem, so renames are atomic).
  std::string hidden = ".";
  hidden += target.filename().string();
  const std::string tag = std::to_string(::getpid()) + "-" + std::to_string(g_stage_counter++);
  const fs::path stage = parent / (hidden + ".tmp-" + tag);
  fs::remove_all(stage, ec);
  if (!fs::create_directory(stage, ec)) LS_THROW << stage.string() << ": cannot create: " << ec.message();
  try {
    write_config_json((stage / "config.json").string(), config, format);
    save_params(stage.string(), layout, base, format, max_shard_bytes);
    if (fs::is_directory(target)) {
      // Keep what else lives there (tokenizer files, ...): hard links cost
      // nothing and leave the old directory untouched.
      for (const auto& e : fs::directory_iterator(target)) {
        const std::string name = e.path().filename().string();
        if (written_by_save(name)) continue;
        fs::copy(e.path(), stage / name,
                 fs::copy_options::recursive | fs::copy_options::create_hard_links |
                     fs::copy_options::copy_symlinks,
                 ec);
        if (ec) {  // e.g. a filesystem without hard links: copy the bytes
          ec.clear();
          fs::copy(e.path(), stage / name, fs::copy_options::recursive | fs::copy_options::copy_symlinks);
        }
      }
    }
    sync_directory(stage.string());
    if (!fs::exists(target)) {
      fs::rename(stage, target);
    } else if (::renameat2(AT_FDCWD, stage.c_str(), AT_FDCWD, target.c_str(), RENAME_EXCHANGE) == 0) {
      // `stage` now holds the old checkpoint.
      fs::remove_all(stage, ec);
    } else {
      // No atomic exchange here: two renames leave a short window without `dir`
      // but never a half-written one.
      const fs::path old = parent / (hidden + ".old-" + tag);
      fs::rename(target, old);
      std::error_code ec2;
      fs::rename(stage, target, ec2);
      if (ec2) {
        fs::rename(old, target, ec);  // put the old checkpoint back
        LS_THROW << dir << ": save_pretrained: cannot move the new checkpoint in place: " << ec2.message();
      }
      fs::remove_all(old, ec);
    }
    sync_directory(parent.string());
  } catch (const fs::filesystem_error& e) {
    fs::remove_all(stage, ec);
    LS_THROW << dir << ": save_pretrained failed: " << e.what();
  } catch (...) {
    fs::remove_all(stage, ec);
    throw;
  }
}

PretrainedModel load_pretrained(const std::string& dir, const Context* ctx) {
  PretrainedModel m;
  m.config = load_hf_config((fs::path(dir) / "config.json").string());
  m.layout = ParamLayout(m.config);
  m.params = alloc_params(m.layout);
  load_params(dir, m.layout, m.params.as<float>(), ctx);
  return m;
}

}  // namespace lockstep
