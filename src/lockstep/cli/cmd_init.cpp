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
  const SaveFormat format = dtype_name == "bf16"  ? SaveFormat::BF16
                            : dtype_name == "fp8" ? SaveFormat::FP8
                                                  : SaveFormat::F32;
  if (dtype_name != "bf16" && dtype_name != "f32" && dtype_name != "fp8")
    LS_THROW << "--dtype must be f32, bf16 or fp8, got " << dtype_name;
  const bool tokenizer = !args.flag("no-tokenizer");
  if (tokenizer) {
    // Byte-level tokenizer: ids 0..255 bytes, then <|endoftext|>, <|im_start|>, <|im_end|>.
    if (m.config.vocab_size < 259)
      LS_THROW << cfg_path << ": vocab_size " << m.config.vocab_size
               << " is too small for the byte-level tokenizer (needs >= 259); use --no-tokenizer";
    if (m.config.eos_token_ids.empty()) m.config.eos_token_ids = {258};
  }
  ParamLayout layout(m.config);
  save_pretrained(out, m.config, layout, m.params.as<float>(), format);
  if (tokenizer) tokenizer::write_byte_level_tokenizer(out);
  std::cout << "wrote " << out << ": " << architecture_name(m.config.architecture) << ", " << layout.numel()
            << " parameters" << (tokenizer ? ", byte-level tokenizer" : "") << "\n";
  return 0;
}

LS_REGISTER_COMMAND(Command{
    "init",
    "write a randomly initialised model in Hugging Face layout",
    "usage: lockstep init --config MODEL.toml --out DIR [--seed N] [--dtype f32|bf16|fp8] [--no-tokenizer]\n"
    "                     [--threads N] [--set model.key=value ...]\n\n"
    "Builds the model described by the [model] section (keys: docs/model.md; init_seed and\n"
    "init_std set the random initialisation) and writes DIR/config.json, DIR/model.safetensors\n"
    "and a byte-level tokenizer (tokenizer.json, tokenizer_config.json with a ChatML template).\n"
    "--dtype fp8 writes DeepSeek-V4 in the official release's storage: FP8 e4m3 weights with\n"
    "power-of-two 128 x 128 block scales, MXFP4 routed experts when expert_dtype = \"fp4\"\n"
    "(docs/deepseek-v4.md); any other architecture in the FP8 layout of `lockstep export`.\n",
    {"no-tokenizer"},
    run_init});

}  // namespace
}  // namespace lockstep::cli
