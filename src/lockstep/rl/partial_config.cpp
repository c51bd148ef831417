// Partial rollouts' [rollout] keys and the settings they refuse: apart from
// the bookkeeping, so that the config readers link without the engines.
#include <string>

#include "lockstep/base/error.h"
#include "lockstep/rl/partial_rollout.h"

namespace lockstep::rl {

PartialConfig partial_config_from_toml(TomlSection& s) {
  PartialConfig p;
  p.enabled = s.get_bool("partial", p.enabled);
  if (!p.enabled) {
    for (const char* key : {"partial_token_budget", "partial_max_staleness", "partial_gap"})
      if (s.has(key)) s.fail(key, "only used with [rollout] partial = true");
    s.not_saved("partial");
    return p;
  }
  p.token_budget = s.get_int("partial_token_budget", p.token_budget, 1);
  // The loop maps the last 64 weight versions to steps (rollout/weight_staleness).
  p.max_staleness = s.get_int("partial_max_staleness", p.max_staleness, 0, 32);
  p.gap_all = s.get_enum("partial_gap", "all", {"all", "current"}) == "all";
  return p;
}

void check_partial_config(const PartialConfig& p, const std::string& source,
                          const rollout::SamplingParams& sampling, bool dynamic_sampling, bool routing_replay,
                          bool multi_turn) {
  if (!p.enabled) return;
  const std::string head = source + ": [rollout] partial = true ";
  if (dynamic_sampling)
    LS_THROW << head << "does not combine with [algo] dynamic_sampling (a step makes one budgeted round)";
  if (routing_replay)
    LS_THROW << head << "does not combine with [algo] routing_replay (a resumed sample's earlier tokens are "
             << "re-prefilled on the new weights, so their recorded routing is not one forward's)";
  if (multi_turn) LS_THROW << head << "does not combine with multi-turn rollouts ([rollout] env)";
  // The processors read the output so far, which a resumed request sees as prompt.
  if (sampling.processes_logits())
    LS_THROW << head << "does not combine with frequency_penalty, presence_penalty, repetition_penalty, "
             << "min_new_tokens or logit_bias (they depend on the output so far)";
  if (!sampling.stop.empty()) LS_THROW << head << "does not combine with stop strings ([rollout] stop)";
}

std::string partial_overlap_error() {
  return "[rollout] partial = true does not combine with [dist] max_weight_staleness > 0 (generating a step "
         "ahead): partial rollouts bound staleness themselves ([rollout] partial_max_staleness)";
}

}  // namespace lockstep::rl
