// `lockstep check-alignment`: samples with the rollout engine (in --precision),
// rescores the same tokens with the trainer (in --trainer-precision, by default
// the same), and prints the mismatch metrics. In aligned mode every gap must be
// exactly zero; --localise names the first intermediate that differs.
#include <cmath>
#include <cstdio>
#include <iostream>
#include <sstream>

#include "lockstep/base/error.h"
#include "lockstep/base/number_text.h"
#include "lockstep/cli/command.h"
#include "lockstep/cli/rollout_flags.h"
#include "lockstep/data/dataset.h"
#include "lockstep/data/jsonl.h"
#include "lockstep/data/rows.h"
#include "lockstep/kernels/gpu/backend.h"
#include "lockstep/model/model_source.h"
#include "lockstep/model/v4_forward.h"
#include "lockstep/rollout/localise.h"
#include "lockstep/rollout/rollout_config.h"
#include "lockstep/train/mismatch.h"
#include "lockstep/train/trainer.h"

namespace lockstep::cli {
namespace {

// Re-runs the rollout (a fresh engine: the same request ids, seeds and so
// tokens) with a capture hook that compares every intermediate with the
// trainer's forward over the same tokens; names the first that differs.
std::string localise(const Context& ctx, const model::ModelWeights& rollout_weights,
                     const model::ModelWeights& trainer_weights, rollout::EngineConfig ec,
                     const std::vector<rollout::Request>& requests,
                     const std::vector<rollout::RequestResult>& results) {
  const rollout::CaptureReference ref =
      rollout::trainer_reference(ctx, trainer_weights, rollout::samples_of(results));
  rollout::CaptureComparer cmp(ref);
  ec.capture = [&](const model::Captured& c) { cmp(c); };
  rollout::Engine engine(ctx, &rollout_weights, ec);
  engine.generate(requests);
  std::ostringstream os;
  os << cmp.first().str() << " [" << cmp.compared_rows() << " rows compared]";
  return os.str();
}

// The report's table: the gap, its max, k3, the bitwise-equal fraction, the
// router and indexer disagreements.
void print_mismatch(const train::MismatchStats& ms, const std::string& precision,
                    const std::string& trainer_precision, bool aligned, bool replay) {
  std::printf("check-alignment: %lld samples, %lld response tokens, rollout %s, trainer %s (%s)%s\n\n",
              (long long)ms.samples, (long long)ms.tokens, precision.c_str(), trainer_precision.c_str(),
              aligned ? "aligned" : "fast mode", replay ? ", routing replay" : "");
  std::printf("  %-44s %s\n", "metric", "value");
  std::printf("  %-44s %.6g\n", "train/train_rollout_logprob_abs_diff", ms.abs_diff_mean);
  std::printf("  %-44s %.6g\n", "train/train_rollout_logprob_abs_diff_max", ms.abs_diff_max);
  std::printf("  %-44s %.6g\n", "train/train_rollout_kl (k3)", ms.kl_k3);
  std::printf("  %-44s %.6f\n", "tokens with bitwise-equal logprobs", ms.bitwise_equal_frac);
  for (size_t l = 0; l < ms.router_disagreement.size(); ++l) {
    char name[64];
    std::snprintf(name, sizeof name, "router top-k disagreement, MoE layer %zu", l);
    std::printf("  %-44s %.6f\n", name, ms.router_disagreement[l]);
  }
  if (ms.indexer_disagreement)
    std::printf("  %-44s %.6f\n", "indexer top-k disagreement, CSA layers", *ms.indexer_disagreement);
}

// The last line and the exit code: aligned mode promises exactly zero; fast
// mode is checked only when asked (--max-abs-diff), else measured.
int verdict(const Args& args, const train::MismatchStats& ms, bool aligned) {
  const double limit =
      args.has("max-abs-diff") ? args.get_double("max-abs-diff", 0.0) : (aligned ? 0.0 : INFINITY);
  const std::string gap = shortest(ms.abs_diff_mean);
  if (ms.abs_diff_mean > limit) {
    std::printf("\nFAIL: mean |dlogp| %s exceeds %s\n", gap.c_str(), shortest(limit).c_str());
    return 1;
  }
  if (std::isinf(limit))
    std::printf("\nOK: mean |dlogp| %s (fast mode: measured, no limit without --max-abs-diff)\n",
                gap.c_str());
  else
    std::printf("\nOK: mean |dlogp| %s <= %s\n", gap.c_str(), shortest(limit).c_str());
  return 0;
}

// Its own defaults, shorter than generate's: enough tokens to compare, quickly.
constexpr int64_t kDefaultN = 8;
constexpr int64_t kDefaultMaxNewTokens = 64;

int run_check(const Args& args) {
  auto known = kRolloutFlags;
  for (const char* k :
       {"model", "data", "max-abs-diff", "replay", "limit", "json", "trainer-precision", "localise"})
    known.push_back(k);
  args.check_known(known);
  auto pool = make_pool(threads_flag(args));
  Context ctx{pool.get(), 0};
  set_device(ctx, args);
  const std::string data_path = args.require("data");
  LoadedModel m = load_model_dir(args.require("model"), ctx);
  rollout::EngineConfig ec = engine_config_from_args(args);
  rollout::SamplingParams sp = sampling_from_args(args);
  if (!args.has("n")) sp.n = kDefaultN;
  if (!args.has("max-new-tokens")) sp.max_new_tokens = kDefaultMaxNewTokens;
  const std::string precision = args.get("precision", "f32");
  const DType pdt = rollout::precision_dtype(precision);
  // The trainer runs in the same precision (aligned) unless told otherwise (fast mode).
  const std::string trainer_precision = args.get("trainer-precision", precision);
  const bool aligned = trainer_precision == precision;
  const int64_t fp8_block = args.get_int("fp8-block", 128);
  const bool replay = args.flag("replay");
  const ModelConfig& c = m.config;
  const int64_t n_moe = c.num_moe_layers(), K = c.num_experts_per_tok;
  const int64_t n_csa = model::num_csa_layers(c), KI = c.index_topk;  // DeepSeek-V4's indexer

  // Prompts: `prompt_ids`, or text through the tokenizer's chat template.
  std::vector<std::vector<int32_t>> prompts;
  for (const auto& r : data::read_rows(data_path)) {
    prompts.push_back(prompt_ids_from_record(r, data_path, m.tokenizer ? &*m.tokenizer : nullptr, true));
    if (args.has("limit") && int64_t(prompts.size()) >= args.get_int("limit", 0)) break;
  }
  if (prompts.empty()) LS_THROW << data_path << ": no prompts";

  // Rollout side.
  ParamLayout layout(c);
  model::ModelWeights rollout_weights(ctx, layout, m.params.as<float>(), pdt, fp8_block);
  if (!aligned) ec.bf16_kv = true;  // fast mode as `lockstep rl` runs it
  rollout::Engine engine(ctx, &rollout_weights, ec);
  std::vector<rollout::Request> reqs;
  for (auto& p : prompts) {
    rollout::Request q;
    q.prompt_ids = p;
    q.params = sp;
    q.return_experts = n_moe > 0 || n_csa > 0;
    reqs.push_back(std::move(q));
  }
  const std::vector<rollout::Request> requests = reqs;  // kept for --localise's second run
  auto results = engine.generate(std::move(reqs));

  // Trainer side: f32 master weights, its forward in trainer_precision, every token new.
  train::TrainerConfig tc;
  tc.precision = rollout::precision_dtype(trainer_precision);
  tc.fp8_block = fp8_block;
  // The trainer always runs on the CPU: with --device interpret (or a GPU) the
  // check compares the GPU kernels' rollout against the CPU trainer.
  const Context trainer_ctx = kernels::cpu_context(ctx);
  train::Trainer trainer(trainer_ctx, c, std::move(m.params), tc);
  std::vector<train::TrainSequence> seqs;
  std::vector<std::vector<float>> rollout_lp;
  std::vector<std::vector<int32_t>> rollout_routes, train_routes, rollout_indexer, train_indexer;
  for (auto& r : results)
    for (auto& s : r.samples) {
      train::TrainSequence t;
      t.tokens = r.prompt_ids;
      t.tokens.insert(t.tokens.end(), s.output_ids.begin(), s.output_ids.end());
      t.prompt_len = int32_t(r.prompt_ids.size());
      if (replay && n_moe > 0) t.routed_experts = s.routed_experts;
      if (replay && n_csa > 0) t.indexer_topk = s.indexer_topk;
      rollout_lp.push_back(s.logprobs);
      if (n_moe > 0 || n_csa > 0) {
        train::TrainerChoices own = train::trainer_choices(trainer_ctx, trainer.weights(), t.tokens,
                                                           replay && n_moe > 0 ? &s.routed_experts : nullptr,
                                                           replay && n_csa > 0 ? &s.indexer_topk : nullptr);
        rollout_routes.push_back(s.routed_experts);
        train_routes.push_back(std::move(own.experts));
        rollout_indexer.push_back(s.indexer_topk);
        train_indexer.push_back(std::move(own.indexer));
      }
      seqs.push_back(std::move(t));
    }
  train::ScoreOptions so;
  so.temperature = sp.logprob_temperature();
  so.replay = replay && (n_moe > 0 || n_csa > 0);
  auto scores = trainer.score(seqs, so);
  std::vector<std::vector<float>> train_lp;
  for (auto& s : scores) train_lp.push_back(s.logp);
  train::MismatchStats ms = train::compute_mismatch(rollout_lp, train_lp);
  if (n_moe > 0) ms.router_disagreement = train::router_disagreement(rollout_routes, train_routes, n_moe, K);
  if (n_csa > 0)
    ms.indexer_disagreement = train::indexer_disagreement(rollout_indexer, train_indexer, n_csa, KI);

  print_mismatch(ms, precision, trainer_precision, aligned, replay);
  if (sp.processes_logits())
    std::printf(
        "\n  note: the penalties, logit_bias and min_new_tokens change what is sampled, not the reported\n"
        "  logprobs (those of the tempered, unpenalised model), so they leave the comparison unchanged\n");
  if (args.flag("localise")) {
    const std::string where = localise(ctx, rollout_weights, trainer.weights(), ec, requests, results);
    std::printf("\n  localiser: %s\n", where.c_str());
  }
  if (args.has("json")) {
    nlohmann::json j = ms.to_json();
    j["samples"] = ms.samples;
    j["tokens"] = ms.tokens;
    j["precision"] = precision;
    j["trainer_precision"] = trainer_precision;
    j["replay"] = replay;
    data::write_jsonl_atomic(args.get("json", ""), {j});
  }
  return verdict(args, ms, aligned);
}

LS_REGISTER_COMMAND(Command{
    "check-alignment",
    "compare rollout and trainer logprobs on sampled responses",
    std::string(
        "usage: lockstep check-alignment --model DIR --data PROMPTS.jsonl [--precision f32|bf16|fp8]\n"
        "                                [--trainer-precision f32|bf16|fp8] [--n N] [--max-abs-diff X]\n"
        "                                [--replay] [--limit N] [--json OUT] [--localise]\n\n"
        "Samples n responses per prompt with the rollout engine (weights in --precision), rescores\n"
        "the same tokens with the trainer (its forward in --trainer-precision, by default the same:\n"
        "aligned mode; another precision is fast mode, the rollout's KV cache then in bf16), and\n"
        "prints: mean |dlogp| per sample then\n"
        "over samples (train/train_rollout_logprob_abs_diff), its max, the k3 KL estimate, the\n"
        "fraction of bitwise-equal logprobs, the router top-k disagreement per MoE layer and, for\n"
        "DeepSeek-V4, the indexer top-k disagreement over the CSA layers. --replay makes the trainer\n"
        "use the rollout's experts (R3) and indexer choices. --localise re-runs the rollout\n"
        "comparing every intermediate with the trainer's and names the first that differs (layer,\n"
        "point, sample, position). Exits 1 when the mean gap\n"
        "exceeds --max-abs-diff (default 0 in aligned mode, no limit in fast mode).\n"
        "Prompt lines hold prompt_ids, messages, or prompt/text (chat template applied); a PROMPTS\n"
        "file ending in .parquet is read as parquet rows.\n\nflags:\n") +
        rollout_flags_help(kDefaultN, kDefaultMaxNewTokens),
    {"replay", "ignore-eos", "no-prefix-cache", "localise"},
    run_check});

}  // namespace
}  // namespace lockstep::cli
