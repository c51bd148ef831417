// Parsing of the shared rollout flags.
#include "lockstep/cli/rollout_flags.h"

namespace lockstep::cli {

rollout::EngineConfig engine_config_from_args(const Args& args) {
  rollout::EngineConfig e;
  e.num_blocks = args.get_int("kv-blocks", 4096);
  e.block_size = int(args.get_int("block-size", 16));
  e.max_batch_tokens = args.get_int("max-batch-tokens", 2048);
  e.max_running = args.get_int("max-running", 256);
  e.max_prefill_chunk = args.get_int("max-prefill-chunk", 512);
  e.prefix_cache = !args.flag("no-prefix-cache");
  e.seed = uint64_t(args.get_int("seed", 0));
  if (e.num_blocks < 1 || e.block_size < 1 || e.max_batch_tokens < 1 || e.max_running < 1 ||
      e.max_prefill_chunk < 1)
    LS_THROW << "engine limits (--kv-blocks, --block-size, --max-batch-tokens, ...) must be >= 1";
  return e;
}

rollout::SamplingParams sampling_from_args(const Args& args) {
  rollout::SamplingParams p;
  p.n = args.get_int("n", 1);
  p.temperature = float(args.get_double("temperature", 1.0));
  p.top_p = float(args.get_double("top-p", 1.0));
  p.top_k = args.get_int("top-k", 0);
  p.min_p = float(args.get_double("min-p", 0.0));
  p.max_new_tokens = args.get_int("max-new-tokens", 256);
  p.seed = args.get_int("seed", 0);
  p.ignore_eos = args.flag("ignore-eos");
  if (args.has("stop")) p.stop = {args.get("stop", "")};
  p.frequency_penalty = float(args.get_double("frequency-penalty", 0.0));
  p.presence_penalty = float(args.get_double("presence-penalty", 0.0));
  p.repetition_penalty = float(args.get_double("repetition-penalty", 1.0));
  p.min_new_tokens = args.get_int("min-new-tokens", 0);
  p.validate();
  return p;
}

std::vector<int32_t> prompt_ids_from_record(const data::JsonlRecord& r, const std::string& path,
                                            const tokenizer::Tokenizer* tok, bool chat) {
  if (r.value.contains("prompt_ids")) return data::require_ids(r, path, "prompt_ids");
  const bool has_text = r.value.contains("text") || r.value.contains("prompt");
  if (!r.value.contains("messages") && !has_text)
    LS_THROW << path << ":" << r.line << ": each line needs 'prompt_ids', 'messages', 'text' or 'prompt'";
  if (!tok) LS_THROW << path << ":" << r.line << ": text prompts need the model's tokenizer.json";
  if (r.value.contains("messages")) {
    std::vector<tokenizer::ChatMessage> msgs;
    const auto& arr = r.value["messages"];
    if (!arr.is_array()) LS_THROW << path << ":" << r.line << ": 'messages' must be a list";
    for (const auto& x : arr) {
      if (!x.is_object() || !x.contains("role") || !x.contains("content") || !x["role"].is_string() ||
          !x["content"].is_string())
        LS_THROW << path << ":" << r.line << ": each message needs string 'role' and 'content'";
      msgs.push_back({x["role"].get<std::string>(), x["content"].get<std::string>()});
    }
    return tok->encode_chat(msgs, true);
  }
  const std::string text = data::require_string(r, path, r.value.contains("text") ? "text" : "prompt");
  return chat ? tok->encode_chat({{"user", text}}, true) : tok->encode(text, true);
}

std::string rollout_flags_help(int64_t default_n, int64_t default_max_new_tokens) {
  return std::string() + "  --n N                  samples per prompt (default " + std::to_string(default_n) +
         ")\n"
         "  --temperature T        0 = greedy (default 1)\n"
         "  --top-p P --top-k K --min-p P   truncation (defaults off)\n"
         "  --max-new-tokens N     (default " +
         std::to_string(default_max_new_tokens) +
         ")\n"
         "  --seed S               sampling seed (default 0)\n"
         "  --stop STRING          a stop string (needs the model's tokenizer)\n"
         "  --ignore-eos           keep generating past end-of-sequence tokens\n"
         "  --frequency-penalty F --presence-penalty P   OpenAI's, in [-2, 2] (default 0)\n"
         "  --repetition-penalty R > 0, over prompt + response (default 1)\n"
         "  --min-new-tokens N     no EOS, stop token or stop string before N tokens (default 0)\n"
         "                         (these change what is sampled, not the logprobs reported)\n"
         "  --precision P          f32 (default) | bf16 | fp8: the weights' precision (aligned with\n"
         "                         a trainer in the same precision: score, rl)\n"
         "  --fp8-block B          fp8 scale block size, 0 = per tensor (default 128)\n"
         "  --kv-blocks N --block-size B --max-batch-tokens N --max-running N --max-prefill-chunk N\n"
         "  --no-prefix-cache      disable reuse of cached prompt blocks across requests\n"
         "  --threads N            worker threads (default: LOCKSTEP_THREADS or all cores)\n"
         "  --device D             cpu (default) | interpret: the GPU kernels run on the CPU by the\n"
         "                         emulator (slow; tests and debugging) | cuda | hip (docs/gpu.md)\n";
}

}  // namespace lockstep::cli
