// `lockstep export`: a checkpoint directory written again in f32, bf16 or the
// FP8 layout serving engines read (the weights lockstep's fp8 forward uses),
// optionally with a PEFT LoRA adapter merged into its weights.
#include <iostream>

#include "lockstep/base/error.h"
#include "lockstep/cli/command.h"
#include "lockstep/model/export.h"

namespace lockstep::cli {
namespace {

SaveFormat export_format(const std::string& dtype) {
  if (dtype == "f32") return SaveFormat::F32;
  if (dtype == "bf16") return SaveFormat::BF16;
  if (dtype == "fp8") return SaveFormat::FP8;
  LS_THROW << "--dtype must be f32, bf16 or fp8, got " << dtype;
}

int run_export(const Args& args) {
  args.check_known({"from", "out", "dtype", "threads", "merge-lora"});
  const std::string from = args.require("from"), out = args.require("out");
  const SaveFormat format = export_format(args.require("dtype"));
  auto pool = make_pool(args.get_int("threads", 0));
  Context ctx{pool.get(), 0};
  if (const auto adapter = args.maybe("merge-lora")) {
    export_merged_lora(from, *adapter, out, format, &ctx);
    std::cout << "wrote " << out << " (" << save_format_name(format) << ") from " << from
              << " with the LoRA adapter " << *adapter << " merged\n";
    return 0;
  }
  export_pretrained(from, out, format, &ctx);
  std::cout << "wrote " << out << " (" << save_format_name(format) << ") from " << from << "\n";
  return 0;
}

LS_REGISTER_COMMAND(Command{
    "export",
    "write a checkpoint in f32, bf16 or the Hugging Face FP8 layout, optionally with a LoRA adapter merged",
    "usage: lockstep export --from CHECKPOINT_DIR --out DIR --dtype f32|bf16|fp8 [--merge-lora ADAPTER_DIR]\n"
    "                       [--threads N]\n\n"
    "Loads a Hugging Face directory (a `lockstep sft`/`rl` checkpoint such as\n"
    "RUN/checkpoints/step_N or RUN/checkpoints/latest, or any model lockstep loads) and\n"
    "writes DIR/config.json, DIR/model.safetensors and the tokenizer and generation files.\n"
    "  f32, bf16  every tensor in that dtype (bf16 rounds to nearest even).\n"
    "  fp8        the weights a run at [model] precision = \"fp8\" multiplies by: every\n"
    "             projection lockstep packs in fp8 as e4m3 `weight` plus f32\n"
    "             `weight_scale_inv` per 128 x 128 block (DeepSeek-V3's layout, which vLLM\n"
    "             and SGLang read), an untied lm_head as f32 holding its fp8 values, the\n"
    "             rest f32; config.json gets quantization_config. Loaded back (any lockstep\n"
    "             command) at precision fp8 (fp8_block 128, the default) it gives bitwise\n"
    "             the same logprobs as CHECKPOINT_DIR there.\n"
    "             DeepSeek-V4 is written in its official FP8 layout instead (as `init`).\n"
    "With --merge-lora ADAPTER_DIR (a PEFT LoRA adapter of CHECKPOINT_DIR: adapter_config.json\n"
    "and adapter_model.safetensors) every adapted projection is written merged,\n"
    "W + lora_alpha / r * B * A, summed in double and rounded once to f32, before the\n"
    "dtype above applies (docs/lora.md). The adapter must match the model's shapes;\n"
    "rsLoRA, DoRA, biases, per-module ranks and modules_to_save are refused.\n"
    "DIR must not exist or be empty; it is written into a temporary sibling directory\n"
    "and renamed, so it never holds a half-written export (docs/alignment.md).\n",
    {},
    run_export});

}  // namespace
}  // namespace lockstep::cli
