// `lockstep score`: per-token log-probabilities of given responses under a
// model, computed by the trainer's forward. The trainer side of every
// alignment check: its output for `lockstep generate`'s output must equal the
// logprobs the rollout engine reported, bit for bit, in aligned mode.
#include <iostream>

#include "lockstep/base/error.h"
#include "lockstep/base/timer.h"
#include "lockstep/cli/command.h"
#include "lockstep/data/jsonl.h"
#include "lockstep/data/rows.h"
#include "lockstep/model/model_source.h"
#include "lockstep/rollout/rollout_config.h"
#include "lockstep/train/trainer.h"

namespace lockstep::cli {
namespace {

int run_score(const Args& args) {
  args.check_known({"model", "input", "output", "temperature", "threads", "micro-batch-tokens", "entropy",
                    "precision", "fp8-block", "mtp", "device", "logits-chunk"});
  const std::string in = args.require("input"), out = args.require("output");
  auto pool = make_pool(args.get_int("threads", 0));
  Context ctx{pool.get(), 0};
  set_device(ctx, args);
  LoadedModel m = load_model_dir(args.require("model"), ctx);
  const double temperature = args.get_double("temperature", 1.0);
  if (!(temperature > 0)) LS_THROW << "--temperature must be > 0";

  auto records = data::read_rows(in);
  std::vector<train::TrainSequence> seqs;
  for (const auto& r : records) {
    train::TrainSequence s;
    auto prompt = data::require_ids(r, in, "prompt_ids");
    auto response = data::require_ids(r, in, "response_ids");
    if (prompt.empty()) LS_THROW << in << ":" << r.line << ": prompt_ids is empty";
    for (int32_t id : prompt)
      if (id >= m.config.vocab_size)
        LS_THROW << in << ":" << r.line << ": token id " << id << " >= vocab_size";
    for (int32_t id : response)
      if (id >= m.config.vocab_size)
        LS_THROW << in << ":" << r.line << ": token id " << id << " >= vocab_size";
    s.tokens = prompt;
    s.tokens.insert(s.tokens.end(), response.begin(), response.end());
    s.prompt_len = int32_t(prompt.size());
    if (int64_t(s.tokens.size()) > m.config.max_position_embeddings)
      LS_THROW << in << ":" << r.line << ": " << s.tokens.size() << " tokens exceed max_position_embeddings "
               << m.config.max_position_embeddings;
    seqs.push_back(std::move(s));
  }
  const DType precision =
      rollout::precision_dtype(args.get("precision", "f32"));  // as `generate --precision`
  const int64_t logits_chunk = args.get_int("logits-chunk", train::TrainerConfig{}.logits_chunk);
  if (logits_chunk < 0) LS_THROW << "--logits-chunk must be >= 0, got " << logits_chunk;
  // A Scorer: the trainer's own pass on the loaded weights, without the
  // gradients and AdamW moments a Trainer holds, and at f32 without a packed
  // copy (the kernels read the master in place): the same bits.
  train::Scorer trainer(ctx, m.config, std::move(m.params), args.get_int("micro-batch-tokens", 8192),
                        train::TrainerConfig{}.kv_block_size, precision, args.get_int("fp8-block", 128),
                        logits_chunk);
  train::ScoreOptions so;
  so.temperature = float(temperature);
  so.entropy = args.flag("entropy");
  so.mtp = args.flag("mtp");
  if (so.mtp && m.config.num_nextn_predict_layers == 0) LS_THROW << "--mtp: the model has no MTP block";
  Timer timer;
  auto scores = trainer.score(seqs, so);
  std::vector<nlohmann::json> lines;
  int64_t tokens = 0;
  for (size_t i = 0; i < records.size(); ++i) {
    nlohmann::json j = records[i].value;
    j["logprobs"] = scores[i].logp;
    if (so.entropy) j["entropy"] = scores[i].entropy;
    if (so.mtp) j["mtp_logprobs"] = scores[i].mtp_logp;
    tokens += int64_t(seqs[i].tokens.size());
    lines.push_back(std::move(j));
  }
  data::write_jsonl_atomic(out, lines);
  std::cerr << "scored " << records.size() << " sequences (" << tokens << " tokens) in " << timer.seconds()
            << " s\n";
  return 0;
}

LS_REGISTER_COMMAND(Command{
    "score",
    "per-token logprobs of responses under a model (trainer forward)",
    "usage: lockstep score --model DIR --input IN.jsonl --output OUT.jsonl [--temperature T]\n"
    "                      [--entropy] [--threads N] [--micro-batch-tokens N]\n"
    "                      [--precision f32|bf16|fp8] [--fp8-block 128] [--mtp]\n"
    "                      [--logits-chunk N] [--device cpu|interpret|cuda|hip]\n\n"
    "Each input line holds prompt_ids and response_ids (token id arrays); the output repeats\n"
    "each line with `logprobs`: the log-probability of every response token under the model\n"
    "at temperature T (default 1), computed by the trainer's forward. `lockstep generate`\n"
    "output is valid input; an input ending in .parquet is read as parquet rows.\n"
    "--entropy adds the entropy of each position's distribution.\n"
    "--precision runs the forward with the weights in that precision (fp8: power-of-two\n"
    "scales per --fp8-block square); with the same --precision as `generate`, every logprob\n"
    "equals the rollout's bit for bit.\n"
    "--logits-chunk N (default 256) computes the logits and logprobs N rows at a time, so\n"
    "a long response never holds all its (tokens x vocabulary) logits; every value gives the\n"
    "same bits, 0 takes all rows at once.\n"
    "--mtp (DeepSeek-V4 with MTP blocks) adds `mtp_logprobs`: MTP block 0's log-probability\n"
    "of the token two places on, for every response position that has one.\n",
    {"entropy", "mtp"},
    run_score});

}  // namespace
}  // namespace lockstep::cli
