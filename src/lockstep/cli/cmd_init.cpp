// `lockstep init`: a randomly initialised model in Hugging Face layout
// (config.json, safetensors, and a tokenizer: a given one, copied, or a
// byte-level tokenizer.json + tokenizer_config.json covering the vocabulary).
#include <filesystem>
#include <iostream>

#include "lockstep/base/error.h"
#include "lockstep/base/toml_section.h"
#include "lockstep/cli/command.h"
#include "lockstep/model/model_source.h"
#include "lockstep/model/pretrained.h"
#include "lockstep/tokenizer/byte_level.h"
#include "lockstep/tokenizer/tokenizer.h"

namespace lockstep::cli {
namespace {

namespace fs = std::filesystem;

// The files of a Hugging Face tokenizer that init copies when present.
constexpr const char* kTokenizerFiles[] = {"tokenizer.json",      "tokenizer_config.json",
                                           "chat_template.jinja", "special_tokens_map.json",
                                           "vocab.json",          "merges.txt"};

// Loads the tokenizer in `dir` (so a broken one fails before anything is
// written), checks that the model's vocabulary holds every id it can produce,
// and takes its end-of-sequence token when the model config names none.
void check_given_tokenizer(const std::string& dir, const std::string& cfg_path, ModelConfig& config) {
  if (!fs::is_directory(dir)) LS_THROW << "--tokenizer " << fs::absolute(dir).string() << ": not a directory";
  tokenizer::Tokenizer tok = tokenizer::Tokenizer::load(dir);
  if (tok.vocab_size() > config.vocab_size)
    LS_THROW << cfg_path << ": vocab_size " << config.vocab_size << " is smaller than the tokenizer in "
             << fs::absolute(dir).string() << " (ids up to " << tok.vocab_size() - 1
             << "); set [model] vocab_size to at least " << tok.vocab_size();
  if (config.eos_token_ids.empty() && tok.eos_id()) config.eos_token_ids = {*tok.eos_id()};
}

void copy_tokenizer_files(const std::string& from, const std::string& out) {
  for (const char* name : kTokenizerFiles) {
    const fs::path src = fs::path(from) / name;
    if (!fs::exists(src)) continue;
    std::error_code ec;
    fs::copy_file(src, fs::path(out) / name, fs::copy_options::overwrite_existing, ec);
    if (ec) LS_THROW << fs::absolute(src).string() << ": cannot copy into " << out << ": " << ec.message();
  }
}

int run_init(const Args& args) {
  args.check_known({"config", "out", "seed", "dtype", "threads", "no-tokenizer", "tokenizer"});
  const std::string cfg_path = args.require("config"), out = args.require("out");
  auto pool = make_pool(args.get_int("threads", 0));
  Context ctx{pool.get(), 0};
  auto sets = args.sets();
  if (args.has("seed")) sets.push_back("model.init_seed=" + args.get("seed", "0"));
  toml::table root = load_toml_with_overrides(cfg_path, sets);
  if (root["model"]["path"]) LS_THROW << cfg_path << ": [model] path is for loading; init builds a new model";
  LoadedModel m = load_model_from_config(root, cfg_path, ctx);
  const std::string dtype_name = args.get("dtype", "f32");
  const SaveFormat format = dtype_name == "bf16"  ? SaveFormat::BF16
                            : dtype_name == "fp8" ? SaveFormat::FP8
                                                  : SaveFormat::F32;
  if (dtype_name != "bf16" && dtype_name != "f32" && dtype_name != "fp8")
    LS_THROW << "--dtype must be f32, bf16 or fp8, got " << dtype_name;
  const std::string given = args.get("tokenizer", "");
  if (!given.empty() && args.flag("no-tokenizer"))
    LS_THROW << "--tokenizer and --no-tokenizer exclude each other";
  const bool byte_level = given.empty() && !args.flag("no-tokenizer");
  if (!given.empty()) check_given_tokenizer(given, cfg_path, m.config);
  if (byte_level) {
    // Byte-level tokenizer: ids 0..255 bytes, then <|endoftext|>, <|im_start|>, <|im_end|>.
    if (m.config.vocab_size < 259)
      LS_THROW << cfg_path << ": vocab_size " << m.config.vocab_size
               << " is too small for the byte-level tokenizer (needs >= 259); use --no-tokenizer";
    if (m.config.eos_token_ids.empty()) m.config.eos_token_ids = {258};
  }
  ParamLayout layout(m.config);
  save_pretrained(out, m.config, layout, m.params.as<float>(), format);
  if (byte_level)
    tokenizer::write_byte_level_tokenizer(out, {"<|endoftext|>", "<|im_start|>", "<|im_end|>"},
                                          m.config.vocab_size);
  if (!given.empty()) copy_tokenizer_files(given, out);
  std::cout << "wrote " << out << ": " << architecture_name(m.config.architecture) << ", " << layout.numel()
            << " parameters"
            << (byte_level      ? ", byte-level tokenizer"
                : given.empty() ? ""
                                : ", tokenizer of " + given)
            << "\n";
  return 0;
}

LS_REGISTER_COMMAND(Command{
    "init",
    "write a randomly initialised model in Hugging Face layout",
    "usage: lockstep init --config MODEL.toml --out DIR [--seed N] [--dtype f32|bf16|fp8]\n"
    "                     [--tokenizer TOKDIR | --no-tokenizer] [--threads N] [--set model.key=value ...]\n\n"
    "Builds the model described by the [model] section (keys: docs/model.md; init_seed and\n"
    "init_std set the random initialisation) and writes DIR/config.json, DIR/model.safetensors\n"
    "and a tokenizer. --tokenizer TOKDIR copies a Hugging Face tokenizer (tokenizer.json,\n"
    "tokenizer_config.json, chat_template.jinja, ... as present) and refuses a vocab_size\n"
    "smaller than its ids; the model's eos is the tokenizer's when the config names none.\n"
    "Without it, init writes a byte-level tokenizer (ids 0-255 the bytes, then <|endoftext|>,\n"
    "<|im_start|>, <|im_end|>, ChatML template) whose remaining ids up to vocab_size - 1 are\n"
    "ASCII pieces no merge produces: texts encode to bytes, every id decodes to text.\n"
    "--dtype fp8 writes DeepSeek-V4 in the official release's storage: FP8 e4m3 weights with\n"
    "power-of-two 128 x 128 block scales, MXFP4 routed experts when expert_dtype = \"fp4\"\n"
    "(docs/deepseek-v4.md); any other architecture in the FP8 layout of `lockstep export`.\n",
    {"no-tokenizer"},
    run_init});

}  // namespace
}  // namespace lockstep::cli
