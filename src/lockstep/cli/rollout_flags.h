// Flags shared by the commands that run the rollout engine (generate,
// check-alignment): engine limits, sampling parameters, precision.
#pragma once

#include <string>
#include <vector>

#include "lockstep/cli/command.h"
#include "lockstep/data/jsonl.h"
#include "lockstep/rollout/engine.h"
#include "lockstep/tokenizer/tokenizer.h"

namespace lockstep::cli {

inline const std::vector<std::string> kRolloutFlags = {
    "n", "temperature", "top-p", "top-k", "min-p", "max-new-tokens", "seed", "stop", "ignore-eos",
    "frequency-penalty", "presence-penalty", "repetition-penalty", "min-new-tokens",
    "precision", "fp8-block", "kv-blocks", "block-size", "max-batch-tokens", "max-running", "max-prefill-chunk",
    "no-prefix-cache", "threads", "device"};

rollout::EngineConfig engine_config_from_args(const Args& args);
rollout::SamplingParams sampling_from_args(const Args& args);
// A prompt line: `prompt_ids`, `messages` (chat template), or `text`/`prompt`
// (raw, or through the chat template when `chat`). Errors name file and line.
std::vector<int32_t> prompt_ids_from_record(const data::JsonlRecord& r, const std::string& path,
                                            const tokenizer::Tokenizer* tok, bool chat);
inline const char* kRolloutFlagsHelp =
    "  --n N                  samples per prompt (default 1)\n"
    "  --temperature T        0 = greedy (default 1)\n"
    "  --top-p P --top-k K --min-p P   truncation (defaults off)\n"
    "  --max-new-tokens N     (default 256)\n"
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

}  // namespace lockstep::cli
