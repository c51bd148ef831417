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

inline const std::vector<std::string> kRolloutFlags = {"n",
                                                       "temperature",
                                                       "top-p",
                                                       "top-k",
                                                       "min-p",
                                                       "max-new-tokens",
                                                       "seed",
                                                       "stop",
                                                       "ignore-eos",
                                                       "frequency-penalty",
                                                       "presence-penalty",
                                                       "repetition-penalty",
                                                       "min-new-tokens",
                                                       "precision",
                                                       "fp8-block",
                                                       "kv-blocks",
                                                       "block-size",
                                                       "max-batch-tokens",
                                                       "max-running",
                                                       "max-prefill-chunk",
                                                       "no-prefix-cache",
                                                       "threads",
                                                       "device"};

rollout::EngineConfig engine_config_from_args(const Args& args);
rollout::SamplingParams sampling_from_args(const Args& args);
// A prompt line: `prompt_ids`, `messages` (chat template), or `text`/`prompt`
// (raw, or through the chat template when `chat`). Errors name file and line.
std::vector<int32_t> prompt_ids_from_record(const data::JsonlRecord& r, const std::string& path,
                                            const tokenizer::Tokenizer* tok, bool chat);
// The help text of kRolloutFlags, with the defaults of --n and --max-new-tokens
// that the command uses.
std::string rollout_flags_help(int64_t default_n = 1, int64_t default_max_new_tokens = 256);

}  // namespace lockstep::cli
