// Fuzz target: a JSONL dataset, read as lockstep reads train and eval files:
// read_jsonl, then RL prompts (prompt text or messages, label, metadata) and
// SFT pairs, tokenized with a byte-level tokenizer and its ChatML template,
// under the default keys and a second [data] configuration.
#include "lockstep/data/jsonl.h"

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
  g_dir = fs::temp_directory_path() / ("lockstep_fuzz_jsonl_" + std::to_string(::getpid()));
  tokenizer::write_byte_level_tokenizer(g_dir);
  std::atexit(remove_dir);
  g_tok = new tokenizer::Tokenizer(tokenizer::Tokenizer::load(g_dir));
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static fuzz::MemFile file("train.jsonl");
  file.set(data, size);
  const std::string& path = file.path();
  fuzz::run_expecting_error([&] {
    for (const data::JsonlRecord& r : data::read_jsonl(path)) {
      LS_FUZZ_EXPECT(r.value.is_object(), "a record that is not an object");
      fuzz::run_expecting_error([&] { data::require_ids(r, path, "ids"); });
      fuzz::run_expecting_error([&] { data::require_string(r, path, "prompt"); });
    }
  });
  data::DataConfig plain;
  data::DataConfig other;
  other.prompt_key = "question";
  other.response_key = "answer";
  other.label_key = "answer";
  other.apply_chat_template = false;
  other.system_prompt = "Think step by step.";
  other.max_prompt_len = 64;
  other.max_len = 96;
  for (const data::DataConfig* cfg : {&plain, &other}) {
    fuzz::run_expecting_error([&] {
      for (const auto& ex : data::load_prompts(path, *cfg, *g_tok))
        for (const int32_t id : ex.prompt_ids)
          LS_FUZZ_EXPECT(id >= 0 && id < g_tok->vocab_size(), "prompt id");
    });
    fuzz::run_expecting_error([&] {
      for (const auto& ex : data::load_sft_examples(path, *cfg, *g_tok))
        LS_FUZZ_EXPECT(int64_t(ex.prompt_ids.size() + ex.response_ids.size()) <= cfg->max_len, "max_len");
    });
  }
  return 0;
}
