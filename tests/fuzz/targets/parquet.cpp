// Fuzz target: a parquet file as lockstep reads datasets: footer, schema,
// pages (every codec and encoding it reads) and record assembly, then the
// rows as RL prompts with verl's keys (`prompt` a message list).
#include "lockstep/data/parquet.h"

#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "fuzz_common.h"
#include "lockstep/data/dataset.h"
#include "lockstep/tokenizer/byte_level.h"

namespace fs = std::filesystem;
using namespace lockstep;

namespace {

fs::path g_dir;
const tokenizer::Tokenizer* g_tok = nullptr;

void remove_dir() {
  std::error_code ec;
  fs::remove_all(g_dir, ec);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  g_dir = fs::temp_directory_path() / ("lockstep_fuzz_parquet_" + std::to_string(::getpid()));
  tokenizer::write_byte_level_tokenizer(g_dir);
  std::atexit(remove_dir);
  g_tok = new tokenizer::Tokenizer(tokenizer::Tokenizer::load(g_dir));
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  const bool read = fuzz::run_expecting_error([&] {
    for (const auto& row : data::parse_parquet(bytes, "fuzz.parquet"))
      LS_FUZZ_EXPECT(row.is_object(), "a row that is not an object");
  });
  if (!read) return 0;
  // A file that reads also loads as a dataset (or is refused with an Error).
  // The loaders pick the format by the name, so a .parquet link points at
  // the in-memory file.
  static fuzz::MemFile file("train.parquet");
  static const std::string path = [] {
    const fs::path link = g_dir / "train.parquet";
    fs::create_symlink(file.path(), link);
    return link.string();
  }();
  file.set(data, size);
  data::DataConfig verl;
  verl.messages_key = "prompt";
  verl.label_key = "reward_model";
  verl.metadata_key = "extra_info";
  verl.max_prompt_len = 256;
  fuzz::run_expecting_error([&] { data::load_prompts(path, verl, *g_tok); });
  return 0;
}
