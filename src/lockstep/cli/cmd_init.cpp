// `lockstep init`: a randomly initialised model in Hugging Face layout
// (config.json, safetensors, byte-level tokenizer.json + tokenizer_config.json).
#include <iostream>

#include "lockstep/base/error.h"
#include "lockstep/base/toml_section.h"
#include "lockstep/cli/command.h"
#include "lockstep/model/model_source.h"
#include "lockstep/model/pretrained.h"
#include "lockstep/tokenizer/byte_level.h"

namespace lockstep::cli {
namespace {

int run_init(const Args& args) {
  args.check_known({"config", "out", "seed", "dtype", "threads", "no-tokenizer"});
  const std::string cfg_path = args.require("config"), out = args.require("out");
  auto pool = make_pool(args.get_int("threads", 0));
  Context ctx{pool.get(), 0};
  auto sets = args.sets();
  if (args.has("seed")) sets.push_back("model.init_seed=" + args.get("seed", "0"));
  toml::table root = load_toml_with_overrides(cfg_path, sets);
  if (root["model"]["path"]) LS_THROW << cfg_path << ": [model] path is for loading; init builds a new model";
  LoadedModel m = load_model_from_config(root, cfg_path, ctx);
  const std::string dtype_name = args.get("dtype", "f32");
  DType dtype = dtype_name == "bf16" ? DType::BF16 : DType::F32;
  if (dtype_name != "bf16" && dtype_name != "f32") LS_THROW << "--dtype must be f32 or bf16, got " << dtype_name;
  const bool tokenizer = !args.flag("no-tokenizer");
  if (tokenizer) {
    // Byte-level tokenizer: ids 0..255 bytes, then <|endoftext|>, <|im_start|>, <|im_end|>.
    if (m.config.vocab_size < 259)
      LS_THROW << cfg_path << ": vocab_size " << m.config.vocab_size
               << " is too small for the byte-level tokenizer (needs >= 259); use --no-tokenizer";
    if (m.config.eos_token_ids.empty()) m.config.eos_token_ids = {258};
  }
  ParamLayout layout(m.config);
  save_pretrained(out, m.config, layout, m.params.as<float>(), dtype);
  if (tokenizer) tokenizer::write_byte_level_tokenizer(out);
  std::cout << "wrote " << out << ": " << architecture_name(m.config.architecture) << ", "
            << layout.numel() << " parameters" << (tokenizer ? ", byte-level tokenizer" : "") << "\n";
  return 0;
}

LS_REGISTER_COMMAND(Command{
    "init", "write a randomly initialised model in Hugging Face layout",
    "usage: lockstep init --config MODEL.toml --out DIR [--seed N] [--dtype f32|bf16] [--no-tokenizer]\n"
    "                     [--threads N] [--set model.key=value ...]\n\n"
    "Builds the model described by the [model] section (keys: docs/model.md; init_seed and\n"
    "init_std set the random initialisation) and writes DIR/config.json, DIR/model.safetensors\n"
    "and a byte-level tokenizer (tokenizer.json, tokenizer_config.json with a ChatML template).\n",
    {"no-tokenizer"}, run_init});

}  // namespace
}  // namespace lockstep::cli
