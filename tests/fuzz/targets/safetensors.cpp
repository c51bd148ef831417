// Fuzz target: a .safetensors file (8-byte header length, JSON header, tensor
// table, data bounds) and the reads of every tensor it declares; an input that
// starts with '#' is instead a model.safetensors.index.json beside one valid shard.
#include "lockstep/model/safetensors.h"

#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "fuzz_common.h"

namespace fs = std::filesystem;
using namespace lockstep;

namespace {

fs::path g_dir;  // holds model.safetensors.index.json and the shard it may name

void remove_dir() {
  std::error_code ec;
  fs::remove_all(g_dir, ec);
}

bool is_float_dtype(const std::string& d) {
  return d == "F32" || d == "BF16" || d == "F16" || d == "F8_E4M3" || d == "F8_E8M0";
}

// Every tensor read as the API allows; the destinations are sized by numel,
// as the model loader sizes them (an empty tensor gets an empty vector).
void read_all(const SafetensorsFile& f) {
  for (const SafetensorsEntry& e : f.entries()) {
    LS_FUZZ_EXPECT(e.begin <= e.end, e.name);
    LS_FUZZ_EXPECT(f.find(e.name) != nullptr, e.name);
    std::vector<uint8_t> bytes(e.end - e.begin);
    f.read_bytes(e, bytes.data());
    std::vector<float> floats(static_cast<size_t>(e.numel));
    fuzz::run_expecting_error([&] { f.read_f32(e, floats.data()); });
    std::vector<int64_t> ints(static_cast<size_t>(e.numel));
    fuzz::run_expecting_error([&] { f.read_i64(e, ints.data()); });
    if (is_float_dtype(e.dtype)) {
      // A float dtype the reader lists must read without an Error.
      f.read_f32(e, floats.data());
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  g_dir = fs::temp_directory_path() / ("lockstep_fuzz_st_" + std::to_string(::getpid()));
  fs::create_directories(g_dir);
  std::atexit(remove_dir);
  const float a[2] = {1.0f, -2.5f};
  write_safetensors((g_dir / "model-00001-of-00001.safetensors").string(),
                    {{"a", {2}, a}, {"empty", {0, 3}, nullptr}}, DType::BF16);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > 0 && data[0] == '#') {
    {
      std::ofstream out(g_dir / "model.safetensors.index.json", std::ios::binary | std::ios::trunc);
      out.write(reinterpret_cast<const char*>(data + 1), static_cast<std::streamsize>(size - 1));
    }
    fuzz::run_expecting_error([&] {
      SafetensorsCheckpoint ck(g_dir.string());
      for (const std::string& name : ck.names()) {
        const auto loc = ck.locate(name);
        LS_FUZZ_EXPECT(loc.entry != nullptr, name);
        read_all(*loc.file);
      }
    });
    return 0;
  }
  static fuzz::MemFile file("model.safetensors");
  file.set(data, size);
  fuzz::run_expecting_error([&] {
    SafetensorsFile f(file.path());
    read_all(f);
    SafetensorsCheckpoint ck(file.path());
    LS_FUZZ_EXPECT(ck.names().size() == f.entries().size(), "checkpoint and file disagree");
  });
  return 0;
}
