// Tensor checksums in safetensors: the writer puts each tensor's XXH64 in
// __metadata__ as strings (the format stays readable by Hugging Face), every
// read verifies it (one flipped bit in any tensor's data, any storage: F32,
// BF16, FP8, a shard, is refused naming the file and the tensor), and files
// without checksums (from elsewhere) load as before.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "common/test_util.h"
#include "lockstep/comm/checksum.h"
#include "lockstep/model/export.h"
#include "lockstep/model/params.h"
#include "lockstep/model/pretrained.h"
#include "lockstep/model/safetensors.h"
#include "model/model_test_util.h"

namespace lockstep {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using test::expect_error;
using test::TempDir;

const char* kTensor = "model.layers.1.mlp.up_proj.weight";  // layer 1 is dense in tiny_moe_config

struct Model {
  ModelConfig config;
  ParamLayout layout;
  Buffer params;
};

Model random_model(uint64_t seed) {
  const ModelConfig c = test::tiny_moe_config();
  Model m{c, ParamLayout(c), Buffer()};
  m.params = alloc_params(m.layout);
  init_params(m.layout, m.params.as<float>(), seed, 0.5f);
  return m;
}

struct Parsed {
  uint64_t header_len = 0;
  json header;
};

Parsed parse(const std::string& bytes) {
  Parsed p;
  std::memcpy(&p.header_len, bytes.data(), 8);
  p.header = json::parse(bytes.substr(8, p.header_len));
  return p;
}

// Flips one bit in the middle of tensor `name`'s data.
void flip_bit_in(const std::string& path, const std::string& name) {
  std::string b = test::read_bytes(path);
  const Parsed p = parse(b);
  const uint64_t begin = p.header[name]["data_offsets"][0].get<uint64_t>();
  const uint64_t end = p.header[name]["data_offsets"][1].get<uint64_t>();
  ASSERT_LT(begin, end) << name;
  b[8 + p.header_len + (begin + end) / 2] ^= 0x10;
  test::write_bytes(path, b);
}

// The file as another writer would make it: the same tensors and bytes,
// __metadata__ {"format": "pt"} only.
void strip_checksums(const std::string& path) {
  const std::string b = test::read_bytes(path);
  Parsed p = parse(b);
  p.header["__metadata__"] = {{"format", "pt"}};
  const std::string h = p.header.dump();
  std::string out(8, '\0');
  const uint64_t n = h.size();
  std::memcpy(out.data(), &n, 8);
  test::write_bytes(path, out + h + b.substr(8 + p.header_len));
}

TEST(SafetensorsChecksum, EachTensorsXxh64IsAStringInTheMetadata) {
  TempDir dir("stck");
  Model m = random_model(1);
  save_params(dir.str(), m.layout, m.params.as<float>(), DType::F32);
  const std::string b = test::read_bytes(dir.str("model.safetensors"));
  const Parsed p = parse(b);
  const json& meta = p.header["__metadata__"];
  EXPECT_EQ(meta["format"], "pt");
  for (auto it = meta.begin(); it != meta.end(); ++it) EXPECT_TRUE(it.value().is_string()) << it.key();
  for (const ParamInfo& info : m.layout.params()) {
    const std::string key = std::string(kChecksumKeyPrefix) + info.name;
    ASSERT_TRUE(meta.contains(key)) << key;
    // Of the bytes as stored: here the f32 values themselves.
    const float* v = m.params.as<float>() + info.offset;
    EXPECT_EQ(meta[key], comm::checksum_hex(comm::checksum64(v, size_t(info.numel) * 4))) << info.name;
  }
  SafetensorsFile f(dir.str("model.safetensors"));
  EXPECT_TRUE(f.has_checksums());
}

// lockstep export writes them too, in every format, and a Hugging Face
// reader's view of the header is unchanged: a string-to-string map with
// "format": "pt".
TEST(SafetensorsChecksum, ExportWritesThemInEveryFormat) {
  TempDir src("stck");
  Model m = random_model(6);
  save_pretrained(src.str("model"), m.config, m.layout, m.params.as<float>(), DType::F32);
  for (SaveFormat f : {SaveFormat::F32, SaveFormat::BF16, SaveFormat::FP8}) {
    const std::string out = src.str(std::string("export-") + save_format_name(f));
    export_pretrained(src.str("model"), out, f);
    const json h = parse(test::read_bytes(out + "/model.safetensors")).header;
    const json& meta = h["__metadata__"];
    EXPECT_EQ(meta["format"], "pt");
    for (auto it = meta.begin(); it != meta.end(); ++it) EXPECT_TRUE(it.value().is_string()) << it.key();
    for (auto it = h.begin(); it != h.end(); ++it) {
      if (it.key() == "__metadata__") continue;
      EXPECT_TRUE(meta.contains(kChecksumKeyPrefix + it.key())) << it.key();
    }
    load_pretrained(out);  // verifies every tensor
  }
  // A corrupt source is not exported.
  flip_bit_in(src.str("model/model.safetensors"), kTensor);
  expect_error([&] { export_pretrained(src.str("model"), src.str("export-bad"), SaveFormat::BF16); },
               {"model.safetensors: tensor '" + std::string(kTensor) + "' fails its checksum"});
  EXPECT_FALSE(fs::exists(src.str("export-bad")));
}

TEST(SafetensorsChecksum, AFlippedBitInATensorIsRefusedNamingFileAndTensor) {
  for (DType dt : {DType::F32, DType::BF16}) {
    TempDir dir("stck");
    Model m = random_model(2);
    save_params(dir.str(), m.layout, m.params.as<float>(), dt);
    Buffer back = alloc_params(m.layout);
    load_params(dir.str(), m.layout, back.as<float>());  // intact: loads
    flip_bit_in(dir.str("model.safetensors"), kTensor);
    expect_error(
        [&] { load_params(dir.str(), m.layout, back.as<float>()); },
        {"model.safetensors: tensor '" + std::string(kTensor) + "' fails its checksum (file corrupt)"});
    // Every read path verifies, not only load_params.
    SafetensorsFile f(dir.str("model.safetensors"));
    std::vector<uint8_t> raw(f.find(kTensor)->end - f.find(kTensor)->begin);
    expect_error([&] { f.read_bytes(*f.find(kTensor), raw.data()); }, {kTensor, "fails its checksum"});
    expect_error([&] { f.verify(*f.find(kTensor)); }, {kTensor, "fails its checksum"});
  }
}

TEST(SafetensorsChecksum, Fp8AndShardedFilesAreVerifiedToo) {
  TempDir fp8("stck");
  Model m = random_model(3);
  save_params(fp8.str(), m.layout, m.params.as<float>(), SaveFormat::FP8);
  Buffer back = alloc_params(m.layout);
  load_params(fp8.str(), m.layout, back.as<float>());
  flip_bit_in(fp8.str("model.safetensors"), kTensor);  // F8_E4M3 codes
  expect_error([&] { load_params(fp8.str(), m.layout, back.as<float>()); }, {kTensor, "fails its checksum"});

  TempDir sharded("stck");
  save_params(sharded.str(), m.layout, m.params.as<float>(), DType::F32, 4096);
  const json idx = json::parse(test::read_bytes(sharded.str("model.safetensors.index.json")));
  const std::string shard = idx["weight_map"][kTensor];
  ASSERT_NE(shard, "model.safetensors");
  load_params(sharded.str(), m.layout, back.as<float>());
  flip_bit_in(sharded.str(shard), kTensor);
  expect_error([&] { load_params(sharded.str(), m.layout, back.as<float>()); },
               {shard + ": tensor '" + kTensor + "' fails its checksum"});
}

TEST(SafetensorsChecksum, AFileWithoutChecksumsLoadsAsBefore) {
  TempDir dir("stck");
  Model m = random_model(4);
  save_params(dir.str(), m.layout, m.params.as<float>(), DType::F32);
  strip_checksums(dir.str("model.safetensors"));
  SafetensorsFile f(dir.str("model.safetensors"));
  EXPECT_FALSE(f.has_checksums());
  EXPECT_FALSE(f.find(kTensor)->has_checksum);
  Buffer back = alloc_params(m.layout);
  load_params(dir.str(), m.layout, back.as<float>());
  test::expect_bits_equal(m.params.as<float>(), back.as<float>(), m.layout.numel(), "no checksums");
}

TEST(SafetensorsChecksum, DamagedChecksumKeysAreRefused) {
  TempDir dir("stck");
  Model m = random_model(5);
  save_params(dir.str(), m.layout, m.params.as<float>(), DType::F32);
  const std::string path = dir.str("model.safetensors");
  const std::string good = test::read_bytes(path);
  const std::string key = std::string(kChecksumKeyPrefix) + kTensor;
  const size_t at = good.find(key);
  ASSERT_NE(at, std::string::npos);
  const size_t value = good.find('"', at + key.size() + 2) + 1;  // "key":"<16 hex>"
  Buffer back = alloc_params(m.layout);

  std::string b = good;  // another valid hex digit: the data no longer matches
  b[value] = b[value] == '0' ? '1' : '0';
  test::write_bytes(path, b);
  expect_error([&] { load_params(dir.str(), m.layout, back.as<float>()); }, {kTensor, "fails its checksum"});

  b = good;  // not a hex digit
  b[value] = 'x';
  test::write_bytes(path, b);
  expect_error([&] { SafetensorsFile f(path); }, {"model.safetensors", key, "not 16 lowercase hex digits"});

  b = good;  // a damaged key: the tensor would go unchecked
  b[at + 1] ^= 0x01;
  test::write_bytes(path, b);
  expect_error([&] { SafetensorsFile f(path); }, {"model.safetensors", "has no checksum while"});
}

}  // namespace
}  // namespace lockstep
