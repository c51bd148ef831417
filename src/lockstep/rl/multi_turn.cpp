// The multi-turn rollout: reset every episode, then rounds of (all active
// episodes' next turns generated together -> all their step() calls in
// parallel -> observations appended) until none is active.
#include "lockstep/rl/multi_turn.h"

#include <algorithm>
#include <atomic>
#include <climits>
#include <exception>
#include <mutex>
#include <optional>
#include <thread>

#include "lockstep/base/error.h"
#include "lockstep/base/rng.h"
#include "lockstep/base/timer.h"
#include "lockstep/data/dataset.h"

namespace lockstep::rl {

namespace {

// Environment calls block on Python workers or HTTP services: at most this
// many run at once from one round (the workers bound the real parallelism).
constexpr size_t kMaxEnvThreads = 64;
// The streaming schedule runs an episode per thread (most of them waiting on
// the engine or on their environment); more episodes queue for a thread.
constexpr size_t kMaxStreamThreads = 1024;

// fn(i) for i in [0, n) on up to kMaxEnvThreads threads; the first
// exception any call threw is rethrown after all have finished.
template <typename Fn>
void parallel_for(size_t n, const Fn& fn) {
  std::atomic<size_t> next{0};
  std::mutex mu;
  std::exception_ptr first;
  auto work = [&] {
    for (size_t i = next++; i < n; i = next++) {
      try {
        fn(i);
      } catch (...) {
        std::lock_guard<std::mutex> lk(mu);
        if (!first) first = std::current_exception();
      }
    }
  };
  std::vector<std::thread> threads;
  for (size_t t = 1; t < std::min(n, kMaxEnvThreads); ++t) threads.emplace_back(work);
  work();
  for (auto& t : threads) t.join();
  if (first) std::rethrow_exception(first);
}

// What one reset or step call gave an episode: what every trainer rank
// applies to its copy of the episode.
struct Outcome {
  std::optional<std::string> error;  // the call failed (EnvFailure's message)
  EnvReset reset;
  EnvStep step;
};
using Outcomes = std::vector<std::optional<Outcome>>;  // per episode; none: not called

nlohmann::json encode_outcome(size_t i, const Outcome& o) {
  nlohmann::json j = {{"i", i}, {"d", o.step.done}};
  if (o.error) j["err"] = *o.error;
  if (o.reset.messages) j["rm"] = messages_to_json(*o.reset.messages);
  if (o.reset.prompt) j["rp"] = *o.reset.prompt;
  if (o.step.observation) j["obs"] = *o.step.observation;
  if (o.step.reward) j["r"] = *o.step.reward;  // doubles round-trip through JSON exactly
  return j;
}

void decode_outcome(const nlohmann::json& j, Outcomes& out) {
  Outcome o;
  if (j.contains("err")) o.error = j["err"].get<std::string>();
  if (j.contains("rm")) {
    o.reset.messages.emplace();
    for (const auto& m : j["rm"]) o.reset.messages->push_back({m["role"].get<std::string>(), m["content"].get<std::string>()});
  }
  if (j.contains("rp")) o.reset.prompt = j["rp"].get<std::string>();
  if (j.contains("obs")) o.step.observation = j["obs"].get<std::string>();
  if (j.contains("r")) o.step.reward = j["r"].get<double>();
  o.step.done = j["d"].get<bool>();
  out.at(j["i"].get<size_t>()) = std::move(o);
}

void fail(Episode& e, const std::string& why) {
  e.env_failed = true;
  e.env_error = why;
  e.finish_reason = "env_error";
  e.finished = true;
}

}  // namespace

// Wall time during which at least one environment call is in flight
// (parallel calls counted once), over the threads of a streaming run.
class EnvClock {
 public:
  void begin() {
    std::lock_guard<std::mutex> l(mu_);
    if (active_++ == 0) since_.reset();
  }
  void end() {
    std::lock_guard<std::mutex> l(mu_);
    if (--active_ == 0) total_ += since_.seconds();
  }
  double seconds() {
    std::lock_guard<std::mutex> l(mu_);
    return total_;
  }

 private:
  std::mutex mu_;
  int active_ = 0;
  Timer since_;
  double total_ = 0;
};

std::string observation_text(const tokenizer::Tokenizer& tok, const std::vector<tokenizer::ChatMessage>& history,
                             const std::string& role, const std::string& observation,
                             const std::string& end_of_turn_text) {
  const std::string before = tok.apply_chat_template(history, /*add_generation_prompt=*/false);
  std::vector<tokenizer::ChatMessage> next = history;
  next.push_back({role, observation});
  const std::string after = tok.apply_chat_template(next, /*add_generation_prompt=*/true);
  const size_t eot = end_of_turn_text.empty() ? std::string::npos : before.rfind(end_of_turn_text);
  const size_t cut = eot == std::string::npos ? before.size() : eot + end_of_turn_text.size();
  if (after.compare(0, cut, before, 0, cut) != 0)
    LS_THROW << "multi-turn rollout: the chat template '" << tok.chat_template().name()
             << "' does not extend a conversation by appending to it (a new message changes the text before it), "
             << "so the episode cannot stay one token sequence";
  return after.substr(cut);
}

MultiTurnRollout::MultiTurnRollout(RolloutBackend& rollout, Environment& env, const tokenizer::Tokenizer& tok,
                                   const EnvConfig& cfg, rollout::SamplingParams base, int64_t context)
    : rollout_(rollout), env_(env), tok_(tok), cfg_(cfg), base_(std::move(base)), context_(context) {
  end_of_turn_ = data::end_of_turn_id(tok);
  end_of_turn_text_ = tok.decode(std::vector<int32_t>{end_of_turn_}, false);
  if (std::find(base_.stop_token_ids.begin(), base_.stop_token_ids.end(), end_of_turn_) == base_.stop_token_ids.end())
    base_.stop_token_ids.push_back(end_of_turn_);
  base_.return_logprobs = true;
}

// Tokens the episode may still add: within max_total_tokens and, the whole
// sequence, below the model's context (the engine refuses a prompt that fills it).
int64_t MultiTurnRollout::budget_left(const Episode& e) const {
  int64_t left = INT64_MAX / 2;  // no budget: max_turns bounds the episode
  if (cfg_.max_total_tokens > 0) left = cfg_.max_total_tokens - int64_t(e.output_ids.size());
  if (context_ > 0) left = std::min(left, context_ - 1 - int64_t(e.prompt_ids.size() + e.output_ids.size()));
  return left;
}

std::vector<Episode> MultiTurnRollout::run(const std::vector<EpisodePrompt>& prompts, MultiTurnStats* stats) {
  MultiTurnStats st;
  const int64_t first_session = next_session_;
  std::vector<Episode> eps(prompts.size() * size_t(base_.n));
  next_session_ += int64_t(eps.size());
  // Every session is closed, also when an error ends the run (close never throws).
  const auto mine = owned(eps.size());
  auto close_all = [&] {
    parallel_for(mine.second - mine.first, [&](size_t k) { env_.close(first_session + int64_t(mine.first + k)); });
  };
  try {
    if (rollout_.can_stream() && (!group_ || group_->ranks() == 1)) {
      run_streaming(eps, prompts, first_session, st);
      close_all();
      if (stats) *stats = st;
      return eps;
    }
    reset_all(eps, prompts, first_session, st);
    for (;;) {
      const bool active = std::any_of(eps.begin(), eps.end(), [](const Episode& e) { return !e.finished; });
      if (!active) break;
      ++st.rounds;
      generate_turns(eps, prompts, st);
      step_all(eps, first_session, st);
    }
  } catch (...) {
    close_all();
    throw;
  }
  Timer t;
  close_all();
  st.env_seconds += t.seconds();
  if (stats) *stats = st;
  return eps;
}

std::pair<size_t, size_t> MultiTurnRollout::owned(size_t episodes) const {
  return group_ ? group_->shard(episodes) : std::pair<size_t, size_t>{0, episodes};
}

// Every rank's outcomes to every rank (a no-op on one rank): afterwards `out`
// holds the calls of all episodes, each made once, by its owner.
static void exchange(TrainerGroup* group, std::pair<size_t, size_t> mine, Outcomes& out) {
  if (!group || group->ranks() == 1) return;
  nlohmann::json part = nlohmann::json::array();
  for (size_t i = mine.first; i < mine.second; ++i)
    if (out[i]) part.push_back(encode_outcome(i, *out[i]));
  for (const std::string& text : group->gather_strings(part.dump()))
    for (const auto& j : nlohmann::json::parse(text)) decode_outcome(j, out);
}

void MultiTurnRollout::apply_reset(Episode& e, const EpisodePrompt& p, const std::optional<std::string>& error,
                                   const EnvReset& r) const {
  e.prompt_ids = p.prompt_ids;
  e.messages = {{"user", p.prompt_text}};
  if (error) {
    fail(e, *error);
  } else if (r.messages) {
    e.messages = *r.messages;
    e.prompt_ids = tok_.encode_chat(e.messages, /*add_generation_prompt=*/true);
  } else if (r.prompt) {
    e.messages = {{"user", *r.prompt}};
    e.prompt_ids = tok_.encode(*r.prompt, false);
  }
  if (!e.env_failed && e.prompt_ids.empty()) fail(e, "reset gave an empty prompt");
}

void MultiTurnRollout::reset_all(std::vector<Episode>& eps, const std::vector<EpisodePrompt>& prompts,
                                 int64_t first_session, MultiTurnStats& st) {
  Timer t;
  const size_t n = size_t(base_.n);
  const auto mine = owned(eps.size());
  Outcomes out(eps.size());
  parallel_for(mine.second - mine.first, [&](size_t k) {
    const size_t i = mine.first + k;
    Outcome o;
    try {
      o.reset = env_.reset(first_session + int64_t(i), prompts[i / n].sample);
    } catch (const EnvFailure& ex) {
      o.error = ex.what();
    }
    out[i] = std::move(o);
  });
  exchange(group_, mine, out);
  for (size_t i = 0; i < eps.size(); ++i) {
    const Outcome& o = out[i].value();
    apply_reset(eps[i], prompts[i / n], o.error, o.reset);
  }
  for (const auto& e : eps) st.env_failures += e.env_failed ? 1 : 0;
  st.env_seconds += t.seconds();
}

// The request of an episode's next turn (its whole sequence so far).
rollout::Request MultiTurnRollout::turn_request(const Episode& e, const EpisodePrompt& p, size_t i) const {
  rollout::Request r;
  r.prompt_ids = e.prompt_ids;
  r.prompt_ids.insert(r.prompt_ids.end(), e.output_ids.begin(), e.output_ids.end());
  r.params = base_;
  r.params.n = 1;
  r.params.max_new_tokens = std::min(base_.max_new_tokens, budget_left(e));
  // A seed per (prompt, sample, turn): runs repeat, episodes differ.
  const size_t n = size_t(base_.n);
  r.params.seed = int64_t(mix_seed(uint64_t(p.seed), (i % n) * 4096 + uint64_t(e.turns)) >> 1);
  return r;
}

// An episode with no room left for a turn fails (only a prompt from reset
// can leave none); true when it may generate.
bool MultiTurnRollout::room_for_turn(Episode& e) const {
  if (budget_left(e) >= 1) return true;
  fail(e, "the prompt (" + std::to_string(e.prompt_ids.size()) + " tokens) leaves no room for a turn within " +
              "max_total_tokens and the model's context (" + std::to_string(context_) + ")");
  return false;
}

// The generated turn joins the episode.
void MultiTurnRollout::apply_turn(Episode& e, rollout::SampleResult& s) const {
  if (e.turns == 0) e.version = s.weight_version;
  e.version_end = s.weight_version_end;
  ++e.turns;
  e.output_ids.insert(e.output_ids.end(), s.output_ids.begin(), s.output_ids.end());
  e.logprobs.insert(e.logprobs.end(), s.logprobs.begin(), s.logprobs.end());
  e.loss_mask.insert(e.loss_mask.end(), s.output_ids.size(), uint8_t(1));
  e.last_completion = tok_.decode(s.output_ids, /*skip_special_tokens=*/true);
  e.messages.push_back({"assistant", e.last_completion});
  if (s.finish_reason == "abort") {
    e.finish_reason = "abort";
    e.finished = true;
  } else if (s.finish_reason == "length") {
    // The turn hit max_new_tokens: out of budget the episode ends after
    // this step; otherwise the turn is closed with the end-of-turn token
    // (a template token: not the model's, masked) and the episode goes on.
    if (budget_left(e) <= 1) {
      e.finish_reason = "budget";
    } else {
      e.output_ids.push_back(end_of_turn_);
      e.logprobs.push_back(0.0f);
      e.loss_mask.push_back(0);
    }
  }
}

// The next turn of every active episode, one request each, all at once.
void MultiTurnRollout::generate_turns(std::vector<Episode>& eps, const std::vector<EpisodePrompt>& prompts,
                                      MultiTurnStats& st) {
  const size_t n = size_t(base_.n);
  std::vector<rollout::Request> reqs;
  std::vector<size_t> who;
  for (size_t i = 0; i < eps.size(); ++i) {
    Episode& e = eps[i];
    if (e.finished) continue;
    if (!room_for_turn(e)) {
      ++st.env_failures;
      continue;
    }
    reqs.push_back(turn_request(e, prompts[i / n], i));
    who.push_back(i);
  }
  int64_t tokens = 0;
  std::vector<rollout::RequestResult> results = rollout_.generate(std::move(reqs), {}, &tokens);
  st.generated_tokens += tokens;
  LS_CHECK(results.size() == who.size()) << "multi-turn rollout: " << results.size() << " results for "
                                         << who.size() << " requests";
  for (size_t k = 0; k < who.size(); ++k) apply_turn(eps[who[k]], results[k].samples.at(0));
}

// step() for every episode that generated this round (each by its owner
// rank); observations appended.
void MultiTurnRollout::step_all(std::vector<Episode>& eps, int64_t first_session, MultiTurnStats& st) {
  Timer t;
  const auto mine = owned(eps.size());
  Outcomes out(eps.size());
  parallel_for(mine.second - mine.first, [&](size_t k) {
    const size_t i = mine.first + k;
    const Episode& e = eps[i];
    if (e.finished) return;
    Outcome o;
    try {
      o.step = env_.step(first_session + int64_t(i), e.messages, e.last_completion);
    } catch (const EnvFailure& ex) {
      o.error = ex.what();
    }
    out[i] = std::move(o);
  });
  exchange(group_, mine, out);
  for (size_t i = 0; i < eps.size(); ++i) {
    if (eps[i].finished) continue;
    const Outcome& o = out[i].value();
    if (o.error) {
      fail(eps[i], *o.error);
      ++st.env_failures;
    } else {
      apply_step(eps[i], o.step);
    }
  }
  st.env_seconds += t.seconds();
}

void MultiTurnRollout::apply_step(Episode& e, const EnvStep& s) const {
  if (s.reward) e.env_reward = e.env_reward.value_or(0.0) + *s.reward;
  if (!e.finish_reason.empty()) {  // out of budget: ends here
    e.finished = true;
    return;
  }
  if (s.done || !s.observation) {
    e.finish_reason = "done";
  } else if (e.turns >= cfg_.max_turns) {
    e.finish_reason = "max_turns";
  } else {
    const std::string text = observation_text(tok_, e.messages, cfg_.role, *s.observation, end_of_turn_text_);
    const std::vector<int32_t> ids = tok_.encode(text, false);
    e.messages.push_back({cfg_.role, *s.observation});
    // Room for the observation and at least one model token.
    if (int64_t(ids.size()) + 1 > budget_left(e)) {
      e.finish_reason = "budget";
    } else {
      e.output_ids.insert(e.output_ids.end(), ids.begin(), ids.end());
      e.logprobs.insert(e.logprobs.end(), ids.size(), 0.0f);
      e.loss_mask.insert(e.loss_mask.end(), ids.size(), uint8_t(0));
      return;
    }
  }
  e.finished = true;
}

// Streaming schedule: each episode on a thread of its own runs reset, then
// (turn streamed to the rollout -> step) until it ends; the rollout batches
// the turns of whichever episodes are generating, so no episode waits for
// another's environment. Episodes are seeded per (prompt, sample, turn) and
// the engine is batch-invariant: the episodes equal the round-by-round
// schedule's, bit for bit.
void MultiTurnRollout::run_streaming(std::vector<Episode>& eps, const std::vector<EpisodePrompt>& prompts,
                                     int64_t first_session, MultiTurnStats& st) {
  const size_t n = size_t(base_.n);
  EnvClock clock;
  std::mutex mu;  // guards st's counters from the episode threads
  std::atomic<size_t> next{0};
  std::exception_ptr first;
  auto work = [&] {
    for (size_t i = next++; i < eps.size(); i = next++) {
      try {
        MultiTurnStats mine;
        run_episode(eps[i], prompts[i / n], i, first_session + int64_t(i), clock, mine);
        std::lock_guard<std::mutex> l(mu);
        st.env_failures += mine.env_failures;
        st.generated_tokens += mine.generated_tokens;
        st.rounds = std::max(st.rounds, mine.rounds);
      } catch (...) {
        std::lock_guard<std::mutex> l(mu);
        if (!first) first = std::current_exception();
        next = eps.size();  // start no further episode
      }
    }
  };
  rollout_.begin_stream();
  std::vector<std::thread> threads;
  for (size_t t = 1; t < std::min(eps.size(), kMaxStreamThreads); ++t) threads.emplace_back(work);
  work();
  for (auto& t : threads) t.join();
  rollout_.end_stream();
  st.env_seconds += clock.seconds();
  if (first) std::rethrow_exception(first);
}

void MultiTurnRollout::run_episode(Episode& e, const EpisodePrompt& p, size_t i, int64_t session, EnvClock& clock,
                                   MultiTurnStats& st) {
  std::optional<std::string> error;
  EnvReset r;
  clock.begin();
  try {
    r = env_.reset(session, p.sample);
  } catch (const EnvFailure& ex) {
    error = ex.what();
  }
  clock.end();
  apply_reset(e, p, error, r);
  st.env_failures += e.env_failed ? 1 : 0;
  while (!e.finished) {
    if (!room_for_turn(e)) {
      ++st.env_failures;
      break;
    }
    rollout::RequestResult result = rollout_.stream(turn_request(e, p, i)).get();
    rollout::SampleResult& s = result.samples.at(0);
    st.generated_tokens += int64_t(s.output_ids.size());
    apply_turn(e, s);
    ++st.rounds;
    EnvStep step;
    clock.begin();
    try {
      step = env_.step(session, e.messages, e.last_completion);
    } catch (const EnvFailure& ex) {
      error = ex.what();
    }
    clock.end();
    if (error) {
      fail(e, *error);
      ++st.env_failures;
      break;
    }
    apply_step(e, step);
  }
}

}  // namespace lockstep::rl
