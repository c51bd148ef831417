// The [eval] config section (shared by `lockstep eval` and the RL loop) and
// the [reward] section as RewardOptions. Unknown keys are errors naming the
// file and the section.
#pragma once

#include <toml++/toml.h>

#include <cstdint>
#include <string>

#include "lockstep/base/toml_section.h"
#include "lockstep/data/dataset.h"
#include "lockstep/eval/evaluator.h"
#include "lockstep/reward/reward.h"

namespace lockstep::eval {

struct EvalSection {
  EvalConfig config;     // name, n, sampling, seed, stop_at_end_of_turn (reward: see below)
  int64_t interval = 0;  // RL loop: evaluate every `interval` steps (0: never)
  std::string output;    // per-problem JSONL ("" = not written)
  std::string summary;   // summary JSON ("" = not written)
};

// Reads [eval]: name, n, temperature, top_p, top_k, min_p, max_new_tokens,
// seed, stop_token_ids, stop_at_end_of_turn, interval, output, summary. The
// caller calls s.finish(). config.reward is left at its default.
EvalSection eval_section_from_toml(TomlSection& s);

// [reward] as RewardOptions (keys as RewardOptions::from_json); a missing
// section gives the defaults. Errors name `source` and the section.
reward::RewardOptions reward_options_from_toml(const toml::table* reward, const std::string& source);

// What a dataset row must hold for this reward: math and exact compare with
// a label; countdown reads its puzzle from the label or, without one, the
// metadata; python and remote rewards may score without one (ground_truth
// None / "label": null), so they need none.
data::PromptNeeds prompt_needs(const reward::RewardOptions& reward);

// A TOML value as JSON (tables become objects, arrays arrays; dates and
// times become their TOML text).
nlohmann::json toml_to_json(const toml::node& node);

}  // namespace lockstep::eval
