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
  if (e.num_blocks < 1 || e.block_size < 1 || e.max_batch_tokens < 1 || e.max_running < 1 || e.max_prefill_chunk < 1)
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

}  // namespace lockstep::cli
