// safetensors I/O: F32/BF16 round trips (single file and sharded with an
// index), files built byte by byte independently of lockstep's writer, every
// validation error with its message, and save_pretrained's all-or-nothing
// replacement of an existing checkpoint directory.
#include "lockstep/model/safetensors.h"

#include <gtest/gtest.h>
#include <sys/resource.h>

#include <cmath>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "common/test_util.h"
#include "lockstep/model/pretrained.h"
#include "model/model_test_util.h"

namespace lockstep {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using test::expect_error;
using test::TempDir;

// ---- files written by hand, not by lockstep's writer ----

struct RawTensor {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  std::string bytes;
};

// The safetensors layout from the spec: u64 LE header length, JSON header,
// data. Data is stored in the reverse order of the header entries, and the
// header is not padded, so offsets and alignment are both exercised.
std::string build_file(const std::vector<RawTensor>& ts, const std::string& extra_header = "") {
  std::vector<uint64_t> begin(ts.size());
  uint64_t off = 0;
  for (size_t k = ts.size(); k-- > 0;) {
    begin[k] = off;
    off += ts[k].bytes.size();
  }
  // Built with appends only (GCC 12 warns falsely on "literal" + std::string&&).
  std::string h = "{";
  for (size_t k = 0; k < ts.size(); ++k) {
    if (k) h += ",";
    h += "\"";
    h += ts[k].name;
    h += "\":{\"dtype\":\"";
    h += ts[k].dtype;
    h += "\",\"shape\":[";
    for (size_t d = 0; d < ts[k].shape.size(); ++d) {
      if (d) h += ",";
      h += std::to_string(ts[k].shape[d]);
    }
    h += "],\"data_offsets\":[";
    h += std::to_string(begin[k]);
    h += ",";
    h += std::to_string(begin[k] + ts[k].bytes.size());
    h += "]}";
  }
  h += extra_header + ",\"__metadata__\":{\"format\":\"pt\"}}";
  std::string out(8, '\0');
  const uint64_t n = h.size();
  for (int i = 0; i < 8; ++i) out[static_cast<size_t>(i)] = static_cast<char>((n >> (8 * i)) & 0xff);
  out += h;
  for (size_t k = ts.size(); k-- > 0;) out += ts[k].bytes;
  return out;
}

void put_u16(std::string& s, uint16_t v) {
  s.push_back(static_cast<char>(v & 0xff));
  s.push_back(static_cast<char>(v >> 8));
}

// Positive normal values only (enough for the test data).
uint16_t f16_bits(float v) {
  int e = 0;
  const float m = std::frexp(v, &e);  // v = m * 2^e, m in [0.5, 1)
  const uint32_t mant = static_cast<uint32_t>((m * 2.0f - 1.0f) * 1024.0f);
  return static_cast<uint16_t>(((e - 1 + 15) << 10) | mant);
}

// The value stored for element j of the k-th tensor: exact in bf16 and f16.
float hand_value(size_t k, int64_t j) {
  return static_cast<float>(k + 1) + static_cast<float>(j) / 8.0f;
}

RawTensor hand_tensor(size_t k, const std::string& name, std::vector<int64_t> shape,
                      const std::string& dtype) {
  RawTensor t{name, dtype, shape, ""};
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  for (int64_t j = 0; j < n; ++j) {
    const float v = hand_value(k, j);
    if (dtype == "BF16") {
      put_u16(t.bytes, static_cast<uint16_t>(f32_bits(v) >> 16));
    } else if (dtype == "F16") {
      put_u16(t.bytes, f16_bits(v));
    } else {
      char b[4];
      std::memcpy(b, &v, 4);
      t.bytes.append(b, 4);
    }
  }
  return t;
}

// A tiny tied Llama model: V=4 D=4 L=1 H=2 Hkv=1 Dh=2 F=4.
ModelConfig hand_config() {
  ModelConfig c;
  c.architecture = Architecture::Llama;
  c.vocab_size = 4;
  c.hidden_size = 4;
  c.num_layers = 1;
  c.num_heads = 2;
  c.num_kv_heads = 1;
  c.head_dim = 2;
  c.intermediate_size = 4;
  c.tie_word_embeddings = true;
  return c;
}

std::vector<RawTensor> hand_tensors() {
  const std::vector<std::pair<std::string, std::vector<int64_t>>> spec = {
      {"model.embed_tokens.weight", {4, 4}},
      {"model.layers.0.input_layernorm.weight", {4}},
      {"model.layers.0.self_attn.q_proj.weight", {4, 4}},
      {"model.layers.0.self_attn.k_proj.weight", {2, 4}},
      {"model.layers.0.self_attn.v_proj.weight", {2, 4}},
      {"model.layers.0.self_attn.o_proj.weight", {4, 4}},
      {"model.layers.0.post_attention_layernorm.weight", {4}},
      {"model.layers.0.mlp.gate_proj.weight", {4, 4}},
      {"model.layers.0.mlp.up_proj.weight", {4, 4}},
      {"model.layers.0.mlp.down_proj.weight", {4, 4}},
      {"model.norm.weight", {4}}};
  std::vector<RawTensor> ts;
  for (size_t k = 0; k < spec.size(); ++k) {
    // Mostly BF16, as real checkpoints; one F16 and one F32 tensor.
    const std::string dt = k == 3 ? "F16" : k == 5 ? "F32" : "BF16";
    ts.push_back(hand_tensor(k, spec[k].first, spec[k].second, dt));
  }
  return ts;
}

TEST(Safetensors, LoadsAFileWrittenByHand) {
  TempDir dir("st");
  const auto ts = hand_tensors();
  test::write_bytes(dir.str("model.safetensors"), build_file(ts));
  ParamLayout l(hand_config());
  Buffer buf = alloc_params(l);
  load_params(dir.str(), l, buf.as<float>());
  for (size_t k = 0; k < ts.size(); ++k) {
    const ParamInfo& p = l.at(ts[k].name);
    for (int64_t j = 0; j < p.numel; ++j)
      ASSERT_EQ(buf.as<float>()[p.offset + j], hand_value(k, j)) << ts[k].name << "[" << j << "]";
  }
  // The header's tensors, seen through the file API.
  SafetensorsFile f(dir.str("model.safetensors"));
  EXPECT_EQ(f.entries().size(), ts.size());
  EXPECT_EQ(f.metadata().at("format"), "pt");
  const SafetensorsEntry* e = f.find("model.layers.0.self_attn.k_proj.weight");
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->dtype, "F16");
  EXPECT_EQ(e->shape, (std::vector<int64_t>{2, 4}));
  EXPECT_EQ(e->end - e->begin, 16u);
}

TEST(Safetensors, F16Conversion) {
  EXPECT_EQ(f16_to_f32(0x3c00), 1.0f);
  EXPECT_EQ(f16_to_f32(0xc000), -2.0f);
  EXPECT_EQ(f16_to_f32(0x7bff), 65504.0f);
  EXPECT_EQ(f16_to_f32(0x0001), std::ldexp(1.0f, -24));  // smallest subnormal
  EXPECT_EQ(f16_to_f32(0x03ff), std::ldexp(1023.0f, -24));
  EXPECT_TRUE(std::isinf(f16_to_f32(0xfc00)) && f16_to_f32(0xfc00) < 0);
  EXPECT_TRUE(std::isnan(f16_to_f32(0x7e00)));
  EXPECT_EQ(f32_bits(f16_to_f32(0x8000)), 0x80000000u);
}

TEST(Safetensors, ShardFileNames) {
  EXPECT_TRUE(is_shard_file_name("model-00001-of-00003.safetensors"));
  EXPECT_FALSE(is_shard_file_name("model-0001-of-00003.safetensors"));
  EXPECT_FALSE(is_shard_file_name("model-0000a-of-00003.safetensors"));
  EXPECT_FALSE(is_shard_file_name("model.safetensors"));
  EXPECT_FALSE(is_shard_file_name("model-00001-of-00003.safetensors.tmp"));
}

// ---- round trips through lockstep's writer ----

struct Model {
  ModelConfig config;
  ParamLayout layout;
  Buffer params;
};

Model random_model(uint64_t seed, ModelConfig c = test::tiny_moe_config()) {
  Model m{c, ParamLayout(c), Buffer()};
  m.params = alloc_params(m.layout);
  init_params(m.layout, m.params.as<float>(), seed, 0.5f);
  // Norms at 1 would hide a swapped tensor; make every value distinct-ish.
  float* w = m.params.as<float>();
  for (int64_t i = 0; i < m.layout.numel(); ++i) w[i] += 1e-3f * static_cast<float>(i % 97);
  return m;
}

uint64_t header_len(const std::string& path) {
  const std::string b = test::read_bytes(path);
  uint64_t n = 0;
  std::memcpy(&n, b.data(), 8);
  return n;
}

TEST(Safetensors, F32RoundTripIsExact) {
  TempDir dir("st");
  Model m = random_model(1);
  save_params(dir.str(), m.layout, m.params.as<float>(), DType::F32);
  EXPECT_TRUE(fs::exists(dir.path() / "model.safetensors"));
  EXPECT_FALSE(fs::exists(dir.path() / "model.safetensors.index.json"));
  Buffer back = alloc_params(m.layout);
  load_params(dir.str(), m.layout, back.as<float>());
  test::expect_bits_equal(m.params.as<float>(), back.as<float>(), m.layout.numel(), "f32 round trip");

  // Header as the reference writer lays it out.
  const std::string path = dir.str("model.safetensors");
  const uint64_t n = header_len(path);
  EXPECT_EQ(n % 8, 0u) << "header padded to 8 bytes";
  EXPECT_EQ(fs::file_size(path), 8 + n + m.layout.nbytes());
  const std::string bytes = test::read_bytes(path);
  const json h = json::parse(bytes.substr(8, n));
  EXPECT_EQ(h["__metadata__"]["format"], "pt");  // and a checksum per tensor (safetensors_checksum_test)
  EXPECT_EQ(h["__metadata__"].size(), m.layout.params().size() + 1);
  EXPECT_EQ(h["model.layers.0.mlp.gate.weight"]["dtype"], "F32");
  EXPECT_EQ(h["model.layers.0.mlp.gate.weight"]["shape"], json({4, 16}));
  EXPECT_EQ(h.size(), m.layout.params().size() + 1);
}

TEST(Safetensors, Bf16RoundTrip) {
  TempDir dir("st");
  Model m = random_model(2);
  const std::vector<float> orig(m.params.as<float>(), m.params.as<float>() + m.layout.numel());
  // Rounded to nearest even on write...
  save_params(dir.str(), m.layout, orig.data(), DType::BF16);
  EXPECT_EQ(fs::file_size(dir.path() / "model.safetensors"),
            8 + header_len(dir.str("model.safetensors")) + m.layout.nbytes() / 2);
  Buffer back = alloc_params(m.layout);
  load_params(dir.str(), m.layout, back.as<float>());
  int64_t changed = 0;
  for (int64_t i = 0; i < m.layout.numel(); ++i) {
    ASSERT_EQ(f32_bits(back.as<float>()[i]), f32_bits(round_bf16(orig[static_cast<size_t>(i)]))) << i;
    changed += back.as<float>()[i] != orig[static_cast<size_t>(i)];
  }
  EXPECT_GT(changed, 0);
  // ...and bf16-representable values come back exactly.
  TempDir dir2("st");
  save_params(dir2.str(), m.layout, back.as<float>(), DType::BF16);
  Buffer again = alloc_params(m.layout);
  load_params(dir2.str(), m.layout, again.as<float>());
  test::expect_bits_equal(back.as<float>(), again.as<float>(), m.layout.numel(), "bf16 round trip");
  const std::string bytes = test::read_bytes(dir2.str("model.safetensors"));
  EXPECT_NE(bytes.find("\"BF16\""), std::string::npos);
}

TEST(Safetensors, ShardedRoundTripWithIndex) {
  TempDir dir("st");
  Model m = random_model(3);
  const uint64_t limit = m.layout.nbytes() / 3;
  save_params(dir.str(), m.layout, m.params.as<float>(), DType::F32, limit);
  EXPECT_FALSE(fs::exists(dir.path() / "model.safetensors"));
  const json idx = json::parse(test::read_bytes(dir.str("model.safetensors.index.json")));
  EXPECT_EQ(idx["metadata"]["total_size"], m.layout.nbytes());
  EXPECT_EQ(idx["weight_map"].size(), m.layout.params().size());
  std::set<std::string> shards;
  for (auto it = idx["weight_map"].begin(); it != idx["weight_map"].end(); ++it) shards.insert(it.value());
  ASSERT_GE(shards.size(), 3u);
  const size_t n = shards.size();
  for (size_t s = 1; s <= n; ++s) {
    char name[64];
    std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", s, n);
    EXPECT_TRUE(shards.count(name)) << name;
    EXPECT_TRUE(fs::exists(dir.path() / name)) << name;
    // A shard exceeds the limit only when it holds a single tensor that does.
    SafetensorsFile f(dir.str(name));
    uint64_t bytes = 0;
    for (const auto& e : f.entries()) bytes += e.end - e.begin;
    if (f.entries().size() > 1) {
      EXPECT_LE(bytes, limit) << name;
    }
  }
  Buffer back = alloc_params(m.layout);
  ThreadPool pool(2);
  Context ctx{&pool, 0};
  load_params(dir.str(), m.layout, back.as<float>(), &ctx);
  test::expect_bits_equal(m.params.as<float>(), back.as<float>(), m.layout.numel(), "sharded round trip");

  // One tensor per shard when the limit is below every tensor.
  TempDir dir1("st");
  Model h = random_model(3, hand_config());
  save_params(dir1.str(), h.layout, h.params.as<float>(), DType::BF16, 1);
  size_t files = 0;
  for (const auto& e : fs::directory_iterator(dir1.path())) files += e.path().extension() == ".safetensors";
  EXPECT_EQ(files, h.layout.params().size());
  Buffer b1 = alloc_params(h.layout);
  load_params(dir1.str(), h.layout, b1.as<float>());
  for (int64_t i = 0; i < h.layout.numel(); ++i)
    ASSERT_EQ(b1.as<float>()[i], round_bf16(h.params.as<float>()[i]));

  // Saving again as one file removes the now-stale shards and index.
  save_params(dir.str(), m.layout, m.params.as<float>(), DType::F32);
  std::vector<std::string> left;
  for (const auto& e : fs::directory_iterator(dir.path())) left.push_back(e.path().filename().string());
  EXPECT_EQ(left, std::vector<std::string>{"model.safetensors"});
}

// ---- validation errors ----

class SafetensorsErrors : public ::testing::Test {
 protected:
  TempDir dir{"st-err"};
  std::string path(const std::string& name) const { return dir.str(name); }
  // A header of exactly `header` with a length field of `len` (default: its size).
  std::string raw(const std::string& header, uint64_t len = UINT64_MAX, const std::string& data = "") {
    if (len == UINT64_MAX) len = header.size();
    std::string out(8, '\0');
    std::memcpy(out.data(), &len, 8);
    return out + header + data;
  }
};

TEST_F(SafetensorsErrors, FileLevel) {
  test::write_bytes(path("short.safetensors"), "abc");
  expect_error([&] { SafetensorsFile f(path("short.safetensors")); }, {"short.safetensors", "truncated"});
  test::write_bytes(path("huge.safetensors"), raw("{}", 1'000'000'000'000ull));
  expect_error([&] { SafetensorsFile f(path("huge.safetensors")); },
               {"huge.safetensors", "header length", "sane"});
  test::write_bytes(path("cut.safetensors"), raw("{\"a\":1}", 500));
  expect_error([&] { SafetensorsFile f(path("cut.safetensors")); }, {"cut.safetensors", "truncated", "500"});
  test::write_bytes(path("json.safetensors"), raw("{\"a\": [1, 2"));
  expect_error([&] { SafetensorsFile f(path("json.safetensors")); }, {"json.safetensors", "invalid JSON"});
  test::write_bytes(path("notobj.safetensors"), raw("[1, 2, 3]"));
  expect_error([&] { SafetensorsFile f(path("notobj.safetensors")); }, {"notobj.safetensors", "JSON object"});
  expect_error([&] { SafetensorsFile f(path("absent.safetensors")); }, {"absent.safetensors", "cannot open"});
}

TEST_F(SafetensorsErrors, EntryLevel) {
  const std::string ok = "{\"w\":{\"dtype\":\"BF16\",\"shape\":[2,2],\"data_offsets\":[0,8]}}";
  test::write_bytes(path("ok.safetensors"), raw(ok, UINT64_MAX, std::string(8, '\0')));
  EXPECT_NO_THROW(SafetensorsFile f(path("ok.safetensors")));
  // The data section ends early: a truncated download.
  test::write_bytes(path("trunc.safetensors"), raw(ok, UINT64_MAX, std::string(5, '\0')));
  expect_error([&] { SafetensorsFile f(path("trunc.safetensors")); },
               {"trunc.safetensors", "truncated", "'w'"});
  // Offsets inconsistent with shape × dtype.
  const std::string bad = "{\"w\":{\"dtype\":\"BF16\",\"shape\":[2,2],\"data_offsets\":[0,6]}}";
  test::write_bytes(path("size.safetensors"), raw(bad, UINT64_MAX, std::string(8, '\0')));
  expect_error([&] { SafetensorsFile f(path("size.safetensors")); },
               {"size.safetensors", "'w'", "6 bytes", "needs 8"});
  const std::string rev = "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,0]}}";
  test::write_bytes(path("rev.safetensors"), raw(rev, UINT64_MAX, std::string(8, '\0')));
  expect_error([&] { SafetensorsFile f(path("rev.safetensors")); }, {"rev.safetensors", "'w'"});
  const std::string dt = "{\"w\":{\"dtype\":\"Q4\",\"shape\":[2],\"data_offsets\":[0,1]}}";
  test::write_bytes(path("dtype.safetensors"), raw(dt, UINT64_MAX, std::string(1, '\0')));
  expect_error([&] { SafetensorsFile f(path("dtype.safetensors")); }, {"dtype.safetensors", "'w'", "Q4"});
  const std::string neg = "{\"w\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}";
  test::write_bytes(path("neg.safetensors"), raw(neg, UINT64_MAX, std::string(4, '\0')));
  expect_error([&] { SafetensorsFile f(path("neg.safetensors")); }, {"neg.safetensors", "shape"});
  const std::string miss = "{\"w\":{\"dtype\":\"F32\",\"shape\":[1]}}";
  test::write_bytes(path("miss.safetensors"), raw(miss, UINT64_MAX, std::string(4, '\0')));
  expect_error([&] { SafetensorsFile f(path("miss.safetensors")); }, {"miss.safetensors", "data_offsets"});
}

TEST_F(SafetensorsErrors, TruncatedCheckpointNamesTheFile) {
  Model m = random_model(4);
  save_params(dir.str(), m.layout, m.params.as<float>(), DType::BF16);
  const std::string p = path("model.safetensors");
  fs::resize_file(p, fs::file_size(p) - 10);
  Buffer b = alloc_params(m.layout);
  expect_error([&] { load_params(dir.str(), m.layout, b.as<float>()); }, {p, "truncated"});
}

TEST_F(SafetensorsErrors, ModelLevel) {
  ParamLayout l(hand_config());
  Buffer buf = alloc_params(l);
  auto load = [&](const std::vector<RawTensor>& ts, const std::string& extra = "") {
    test::write_bytes(path("model.safetensors"), build_file(ts, extra));
    load_params(dir.str(), l, buf.as<float>());
  };
  // Missing tensor.
  auto ts = hand_tensors();
  ts.pop_back();  // model.norm.weight
  expect_error([&] { load(ts); }, {"model.safetensors", "missing tensor", "'model.norm.weight'"});
  // Wrong shape (bytes consistent, so only the shape check can catch it).
  ts = hand_tensors();
  ts[2].shape = {2, 8};
  expect_error([&] { load(ts); },
               {"model.safetensors", "model.layers.0.self_attn.q_proj.weight", "(2, 8)", "(4, 4)"});
  // Unexpected extra tensor: the config and the file disagree.
  ts = hand_tensors();
  ts.push_back(hand_tensor(11, "model.layers.0.self_attn.q_proj.bias", {4}, "BF16"));
  expect_error([&] { load(ts); }, {"model.safetensors", "unexpected tensor", "q_proj.bias"});
  // Tolerated extras: lm_head with tied embeddings (the embedding is used) and inv_freq buffers.
  ts = hand_tensors();
  ts.push_back(hand_tensor(12, "lm_head.weight", {4, 4}, "BF16"));
  ts.push_back(hand_tensor(13, "model.layers.0.self_attn.rotary_emb.inv_freq", {1}, "F32"));
  EXPECT_NO_THROW(load(ts));
  EXPECT_EQ(buf.as<float>()[l.at("model.embed_tokens.weight").offset + 1], hand_value(0, 1));
  // A dtype lockstep does not convert.
  ts = hand_tensors();
  ts[1] = RawTensor{ts[1].name, "I64", {4}, std::string(32, '\0')};
  expect_error([&] { load(ts); }, {"model.safetensors", "input_layernorm", "I64"});
  // No checkpoint at all.
  fs::remove(path("model.safetensors"));
  expect_error([&] { load_params(dir.str(), l, buf.as<float>()); }, {dir.str(), "model.safetensors"});
}

TEST_F(SafetensorsErrors, ShardIndex) {
  auto ts = hand_tensors();
  const std::vector<RawTensor> a(ts.begin(), ts.begin() + 5), b(ts.begin() + 5, ts.end());
  test::write_bytes(path("part-a.safetensors"), build_file(a));
  test::write_bytes(path("part-b.safetensors"), build_file(b));
  json wm;
  for (const auto& t : a) wm[t.name] = "part-a.safetensors";
  for (const auto& t : b) wm[t.name] = "part-b.safetensors";
  json idx = {{"metadata", {{"total_size", 0}}}, {"weight_map", wm}};
  test::write_bytes(path("model.safetensors.index.json"), idx.dump());
  ParamLayout l(hand_config());
  Buffer buf = alloc_params(l);
  load_params(dir.str(), l, buf.as<float>());  // any shard names work
  EXPECT_EQ(buf.as<float>()[l.at("model.norm.weight").offset + 3], hand_value(10, 3));

  json bad = idx;
  bad["weight_map"]["model.norm.weight"] = "part-a.safetensors";
  test::write_bytes(path("model.safetensors.index.json"), bad.dump());
  expect_error([&] { load_params(dir.str(), l, buf.as<float>()); },
               {"model.safetensors.index.json", "model.norm.weight", "part-a.safetensors"});
  bad = idx;
  bad["weight_map"]["model.norm.weight"] = "part-c.safetensors";
  test::write_bytes(path("model.safetensors.index.json"), bad.dump());
  expect_error([&] { load_params(dir.str(), l, buf.as<float>()); }, {"part-c.safetensors", "does not exist"});
  bad = idx;
  bad.erase("weight_map");
  test::write_bytes(path("model.safetensors.index.json"), bad.dump());
  expect_error([&] { load_params(dir.str(), l, buf.as<float>()); },
               {"model.safetensors.index.json", "weight_map"});
}

// ---- save_pretrained / load_pretrained ----

std::map<std::string, std::string> snapshot(const fs::path& dir) {
  std::map<std::string, std::string> m;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.is_regular_file()) m[fs::relative(e.path(), dir).string()] = test::read_bytes(e.path().string());
  return m;
}

TEST(Pretrained, RoundTripAndOverwriteKeepsOtherFiles) {
  TempDir root("pre");
  const std::string dir = root.str("ckpt");
  Model m = random_model(5);
  save_pretrained(dir, m.config, m.layout, m.params.as<float>(), DType::F32, m.layout.nbytes() / 2);
  EXPECT_TRUE(fs::exists(fs::path(dir) / "config.json"));
  EXPECT_TRUE(fs::exists(fs::path(dir) / "model.safetensors.index.json"));
  PretrainedModel p = load_pretrained(dir);
  EXPECT_EQ(p.config, m.config);
  EXPECT_TRUE(p.layout.same_as(m.layout));
  test::expect_bits_equal(m.params.as<float>(), p.params.as<float>(), m.layout.numel(), "load_pretrained");

  // Tokenizer files written by other code survive a new save; old shards do not.
  test::write_bytes(dir + "/tokenizer.json", "{\"model\": {}}");
  Model m2 = random_model(6);
  save_pretrained(dir + "/", m2.config, m2.layout, m2.params.as<float>(), DType::BF16);
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"config.json", "model.safetensors", "tokenizer.json"}));
  EXPECT_EQ(test::read_bytes(dir + "/tokenizer.json"), "{\"model\": {}}");
  PretrainedModel p2 = load_pretrained(dir);
  for (int64_t i = 0; i < m2.layout.numel(); ++i)
    ASSERT_EQ(p2.params.as<float>()[i], round_bf16(m2.params.as<float>()[i]));
  // Nothing but the checkpoint is left in the parent.
  std::vector<std::string> top;
  for (const auto& e : fs::directory_iterator(root.path())) top.push_back(e.path().filename().string());
  EXPECT_EQ(top, std::vector<std::string>{"ckpt"});
}

TEST(Pretrained, LayoutMustMatchConfig) {
  TempDir root("pre");
  Model m = random_model(7);
  ModelConfig other = m.config;
  other.num_layers = 2;
  other.mlp_only_layers = {};
  expect_error([&] { save_pretrained(root.str("x"), other, m.layout, m.params.as<float>()); }, {"layout"});
}

TEST(Pretrained, FailedSaveLeavesThePreviousCheckpointIntact) {
  TempDir root("pre");
  const std::string dir = root.str("ckpt");
  ModelConfig c = test::tiny_moe_config();
  c.vocab_size = 2048;  // embedding alone: 128 KiB in f32
  Model m = random_model(8, c);
  save_pretrained(dir, m.config, m.layout, m.params.as<float>());
  test::write_bytes(dir + "/tokenizer.json", "{}");
  const auto before = snapshot(dir);

  // Make the next save fail in the middle of writing the weights: a file
  // size limit turns the write into EFBIG (SIGXFSZ ignored), as a full disk would.
  Model m2 = random_model(9, c);
  struct rlimit old_limit {};
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &old_limit), 0);
  auto old_handler = std::signal(SIGXFSZ, SIG_IGN);
  struct rlimit small = old_limit;
  small.rlim_cur = 64 * 1024;
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &small), 0);
  bool threw = false;
  std::string msg;
  try {
    save_pretrained(dir, m2.config, m2.layout, m2.params.as<float>());
  } catch (const Error& e) {
    threw = true;
    msg = e.what();
  }
  setrlimit(RLIMIT_FSIZE, &old_limit);
  std::signal(SIGXFSZ, old_handler);
  ASSERT_TRUE(threw) << "the save should have failed";
  EXPECT_NE(msg.find("write failed"), std::string::npos) << msg;

  EXPECT_EQ(snapshot(dir), before) << "the previous checkpoint changed";
  std::vector<std::string> top;
  for (const auto& e : fs::directory_iterator(root.path())) top.push_back(e.path().filename().string());
  EXPECT_EQ(top, std::vector<std::string>{"ckpt"}) << "temporary files left behind";
  PretrainedModel p = load_pretrained(dir);
  test::expect_bits_equal(m.params.as<float>(), p.params.as<float>(), m.layout.numel(), "previous weights");
}

// ---- inputs found by the fuzz target (tests/fuzz/targets/safetensors.cpp) ----

// A number past double's range is nlohmann's out_of_range, not parse_error:
// both must come out as Error naming the file.
TEST(SafetensorsFuzz, HeaderNumberOverflowIsAnError) {
  TempDir dir("st-overflow");
  std::string raw = build_file({{"w", "F32", {1}, std::string(4, '\0')}}, ",\"x\":{\"shape\":[1e400]}");
  test::write_bytes(dir.str("model.safetensors"), raw);
  expect_error([&] { SafetensorsFile f(dir.str("model.safetensors")); },
               {"model.safetensors", "invalid JSON header"});
}

TEST(SafetensorsFuzz, IndexNumberOverflowIsAnError) {
  TempDir dir("st-index-overflow");
  test::write_bytes(dir.str("model.safetensors.index.json"),
                    R"({"metadata": {"total_size": -1e999}, "weight_map": {}})");
  expect_error([&] { SafetensorsCheckpoint ck(dir.str()); },
               {"model.safetensors.index.json", "invalid JSON"});
}

// Names and dtypes from a header or an index are quoted as excerpts: a name of
// kilobytes makes a message of a line, not a copy of the header.
TEST(SafetensorsFuzz, LongNamesAreQuotedAsExcerpts) {
  TempDir dir("st-long-names");
  const std::string name(6000, 'n'), dtype(6000, 'd');
  const auto expect_short = [](const std::function<void()>& fn, const std::string& want) {
    try {
      fn();
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find(want), std::string::npos) << what;
      EXPECT_LT(what.size(), 512u) << what;
    }
  };
  test::write_bytes(dir.str("model.safetensors"), build_file({{name, dtype, {1}, std::string(4, '\0')}}));
  expect_short([&] { SafetensorsFile f(dir.str("model.safetensors")); }, "tensor 'nnnn");
  test::write_bytes(dir.str("model.safetensors"), build_file({{name, "F32", {1}, std::string(4, '\0')}}));
  expect_short([&] { load_params(dir.str(), ParamLayout(hand_config()), nullptr); },
               "unexpected tensor 'nnnn");
  TempDir idx("st-long-index");
  test::write_bytes(idx.str("model.safetensors.index.json"),
                    "{\"weight_map\": {\"" + name + "\": \"" + std::string(6000, 's') + ".safetensors\"}}");
  expect_short([&] { SafetensorsCheckpoint ck(idx.str()); }, "shard 'ssss");
}

// An empty tensor reads into an empty vector, whose data() may be null:
// memcpy(nullptr, p, 0) is undefined behaviour (UBSan: nonnull-attribute).
TEST(SafetensorsFuzz, EmptyTensorsReadIntoNull) {
  TempDir dir("st-empty");
  test::write_bytes(dir.str("model.safetensors"),
                    build_file({{"f", "F32", {0, 4}, ""}, {"i", "I64", {0}, ""}, {"b", "U8", {3, 0}, ""}}));
  SafetensorsFile f(dir.str("model.safetensors"));
  ASSERT_EQ(f.entries().size(), 3u);
  for (const auto& e : f.entries()) {
    EXPECT_EQ(e.numel, 0);
    if (e.dtype == "F32") f.read_f32(e, nullptr);
    if (e.dtype != "F32") f.read_i64(e, nullptr);
    f.read_bytes(e, nullptr);
  }
}

}  // namespace
}  // namespace lockstep
