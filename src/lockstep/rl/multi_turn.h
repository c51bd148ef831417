// Multi-turn rollouts ([rollout] env, docs/agents.md): every sample is an
// episode of an Environment. The engine generates a turn (up to the chat
// template's end-of-turn token), the environment answers, its observation
// becomes a new message whose template tokens are appended to the sample's
// one token sequence, and the extended sequence is the next turn's request
// (the engine's prefix cache serves the history), until the environment is
// done, max_turns or the token budget. All samples' next turns go to the
// rollout together, round by round; environment calls run in parallel.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "lockstep/rl/env.h"
#include "lockstep/rl/rollout_backend.h"
#include "lockstep/rl/trainer_group.h"
#include "lockstep/tokenizer/tokenizer.h"

namespace lockstep::rl {

// One prompt of a round: n episodes start from it.
struct EpisodePrompt {
  std::vector<int32_t> prompt_ids;  // the dataset's, used unless reset gives its own
  std::string prompt_text;
  nlohmann::json sample;  // what reset(sample) receives: prompt, label, metadata
  int64_t seed = 0;       // sampling seed of the prompt; turns and samples derive theirs
};

struct Episode {
  std::vector<int32_t> prompt_ids;  // the episode's prompt (reset's, or the dataset's)
  std::vector<int32_t> output_ids;  // every token after the prompt: model turns and observations
  std::vector<float> logprobs;      // (output_ids) the rollout's for model tokens, 0 for the others
  std::vector<uint8_t> loss_mask;   // (output_ids) 1: the model's token, 0: observation / template
  std::vector<tokenizer::ChatMessage> messages;  // the conversation so far (as step() sees it)
  std::string last_completion;  // the last model turn's text (the verifier's response)
  int64_t turns = 0;            // model turns generated
  std::optional<double> env_reward;  // the sum of the rewards step() gave (none: unset)
  bool env_failed = false;
  std::string env_error;
  // "done" (the environment ended it), "max_turns", "budget"
  // (max_total_tokens), "abort", "env_error". A turn that hits
  // max_new_tokens is closed with the end-of-turn token (masked) and the
  // episode goes on.
  std::string finish_reason;
  uint64_t version = 0, version_end = 0;  // weights of the first turn's first token, the last turn's last
  bool finished = false;
};

struct MultiTurnStats {
  double env_seconds = 0;   // wall time in reset / step calls (parallel calls counted once)
  int64_t env_failures = 0;
  int64_t generated_tokens = 0;
  int64_t rounds = 0;
};

class EnvClock;  // multi_turn.cpp

class MultiTurnRollout {
 public:
  // `base`: the sampling of every turn (n is the episodes per prompt; the
  // end-of-turn stop token and return_logprobs are set here). `context`:
  // the model's max_position_embeddings; an episode that reaches it ends
  // ("budget") rather than overflow the engine (0: unbounded).
  MultiTurnRollout(RolloutBackend& rollout, Environment& env, const tokenizer::Tokenizer& tok, const EnvConfig& cfg,
                   rollout::SamplingParams base, int64_t context = 0);
  // prompts.size() x base.n episodes, prompt-major.
  std::vector<Episode> run(const std::vector<EpisodePrompt>& prompts, MultiTurnStats* stats);
  // Several trainer ranks drive the same episodes (MPI): each rank calls the
  // environment for its contiguous share of them (group->shard) and the
  // outcomes are gathered, so every episode's environment runs once and all
  // ranks hold the same episodes. Every rank must then make the same run()
  // calls (collective). Null: this process calls every episode's environment.
  void share_across(TrainerGroup* group) { group_ = group; }

 private:
  void reset_all(std::vector<Episode>& eps, const std::vector<EpisodePrompt>& prompts, int64_t first_session,
                 MultiTurnStats& st);
  void generate_turns(std::vector<Episode>& eps, const std::vector<EpisodePrompt>& prompts, MultiTurnStats& st);
  void step_all(std::vector<Episode>& eps, int64_t first_session, MultiTurnStats& st);
  // Streaming: every episode runs on its own thread, its turns streamed to
  // the rollout as soon as its environment has answered.
  void run_streaming(std::vector<Episode>& eps, const std::vector<EpisodePrompt>& prompts, int64_t first_session,
                     MultiTurnStats& st);
  void run_episode(Episode& e, const EpisodePrompt& p, size_t i, int64_t session, EnvClock& clock,
                   MultiTurnStats& st);
  // One episode's pieces, shared by both schedules.
  void apply_reset(Episode& e, const EpisodePrompt& p, const std::optional<std::string>& error,
                   const EnvReset& r) const;
  rollout::Request turn_request(const Episode& e, const EpisodePrompt& p, size_t i) const;
  bool room_for_turn(Episode& e) const;
  void apply_turn(Episode& e, rollout::SampleResult& s) const;
  void apply_step(Episode& e, const EnvStep& s) const;
  std::pair<size_t, size_t> owned(size_t episodes) const;  // this rank's episodes
  int64_t budget_left(const Episode& e) const;

  RolloutBackend& rollout_;
  Environment& env_;
  const tokenizer::Tokenizer& tok_;
  EnvConfig cfg_;
  rollout::SamplingParams base_;
  int64_t context_ = 0;
  int32_t end_of_turn_ = -1;
  std::string end_of_turn_text_;
  int64_t next_session_ = 0;
  TrainerGroup* group_ = nullptr;
};

// The template tokens of `observation` as a new `role` message after
// `history` (which ends with the model's turn): the text the chat template
// adds after the end-of-turn token that closed that turn, up to and
// including the next assistant header. Throws Error when the template does
// not extend the conversation by appending (the history must stay one
// token sequence).
std::string observation_text(const tokenizer::Tokenizer& tok, const std::vector<tokenizer::ChatMessage>& history,
                             const std::string& role, const std::string& observation,
                             const std::string& end_of_turn_text);

}  // namespace lockstep::rl
