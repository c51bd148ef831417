// Export of a checkpoint directory in another storage: f32, bf16, or the FP8
// layout serving engines read (pretrained.h SaveFormat), which holds exactly
// the weights lockstep's fp8 forward multiplies by (docs/alignment.md).
#pragma once

#include <string>

#include "lockstep/base/thread_pool.h"
#include "lockstep/model/pretrained.h"

namespace lockstep {

// Loads the checkpoint directory `from` (or the one a checkpoints/latest file
// names, resolve_model_dir) and writes it to `out` in `format`,
// with the tokenizer and generation files of `from` (tokenizer.json,
// tokenizer_config.json, special_tokens_map.json, added_tokens.json,
// chat_template.jinja, generation_config.json; those present).
// Everything is written into a sibling temporary directory that is then
// renamed to `out`, so `out` never holds a half-written export. Error if `out`
// exists and is not an empty directory; nothing is written then.
void export_pretrained(const std::string& from, const std::string& out, SaveFormat format,
                       const Context* ctx = nullptr);

// export_pretrained with a LoRA adapter merged in: loads `from`, the adapter
// directory `adapter_dir` (adapter_config.json + adapter_model.safetensors,
// peft.h load_adapter, checked against the model's shapes), adds s · B · A to
// every adapted projection (merge_lora) and writes the merged model to `out`
// as export_pretrained does.
void export_merged_lora(const std::string& from, const std::string& adapter_dir, const std::string& out,
                        SaveFormat format, const Context* ctx = nullptr);

}  // namespace lockstep
