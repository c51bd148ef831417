// `lockstep generate`: sample responses for a JSONL of prompts with the
// rollout engine. Output lines are valid input to `lockstep score`.
#include <iostream>
#include <map>

#include "lockstep/base/error.h"
#include "lockstep/base/number_text.h"
#include "lockstep/base/progress.h"
#include "lockstep/base/timer.h"
#include "lockstep/cli/command.h"
#include "lockstep/cli/rollout_flags.h"
#include "lockstep/data/jsonl.h"
#include "lockstep/data/rows.h"
#include "lockstep/model/model_source.h"
#include "lockstep/rollout/rollout_config.h"
#include "lockstep/rollout/stop_strings.h"

namespace lockstep::cli {
namespace {

int run_generate(const Args& args) {
  auto known = kRolloutFlags;
  for (const char* k : {"model", "input", "output", "chat", "return-experts"}) known.push_back(k);
  args.check_known(known);
  const std::string in = args.require("input"), out = args.require("output");
  auto pool = make_pool(args.get_int("threads", 0));
  Context ctx{pool.get(), 0};
  set_device(ctx, args);
  LoadedModel m = load_model_dir(args.require("model"), ctx);
  rollout::EngineConfig ec = engine_config_from_args(args);
  rollout::SamplingParams sp = sampling_from_args(args);
  const DType precision = rollout::precision_dtype(args.get("precision", "f32"));
  ParamLayout layout(m.config);
  model::ModelWeights weights(ctx, layout, m.params.as<float>(), precision, args.get_int("fp8-block", 128));
  rollout::Engine engine(ctx, &weights, ec);
  const bool chat = args.flag("chat");

  auto records = data::read_rows(in);
  std::vector<uint64_t> ids;
  std::vector<rollout::Request> reqs;
  for (const auto& r : records) {
    rollout::Request q;
    q.params = sp;
    q.return_experts = args.flag("return-experts");
    q.prompt_ids = prompt_ids_from_record(r, in, m.tokenizer ? &*m.tokenizer : nullptr, chat);
    if (!sp.stop.empty()) {
      if (!m.tokenizer) LS_THROW << "--stop needs the model's tokenizer.json";
      q.stop_checker = rollout::make_stop_checker(*m.tokenizer, sp.stop);
    }
    try {
      ids.push_back(engine.submit(std::move(q)));
    } catch (const Error& e) {
      LS_THROW << in << ":" << r.line << ": " << e.what();
    }
  }
  // Drive the engine here and draw progress between steps.
  const int64_t total = int64_t(records.size()) * sp.n;
  ProgressBar bar("samples", total);
  Timer timer;
  std::map<uint64_t, rollout::RequestResult> results;
  while (engine.step()) {
    auto st = engine.stats();
    bar.update(st.finished_samples, st.generated_tokens);
  }
  for (auto& r : engine.run_until_done(0)) results[r.id] = std::move(r);
  bar.update(total, engine.stats().generated_tokens);
  bar.finish();

  std::vector<nlohmann::json> lines;
  int64_t tokens = 0;
  for (size_t i = 0; i < records.size(); ++i) {
    const auto& res = results.at(ids[i]);
    for (size_t k = 0; k < res.samples.size(); ++k) {
      const auto& s = res.samples[k];
      nlohmann::json j;
      j["index"] = i;
      j["sample"] = k;
      j["prompt_ids"] = res.prompt_ids;
      j["response_ids"] = s.output_ids;
      j["logprobs"] = s.logprobs;
      j["finish_reason"] = s.finish_reason;
      j["weight_version"] = s.weight_version;
      if (m.tokenizer) {
        std::string text = m.tokenizer->decode(s.output_ids, true);
        j["response"] = sp.stop.empty() ? text : rollout::cut_at_stop(text, sp.stop);
      }
      if (!s.routed_experts.empty()) j["routed_experts"] = s.routed_experts;
      if (!s.indexer_topk.empty()) j["indexer_topk"] = s.indexer_topk;
      tokens += int64_t(s.output_ids.size());
      lines.push_back(std::move(j));
    }
  }
  data::write_jsonl_atomic(out, lines);
  const double secs = timer.seconds();
  std::cerr << "generated " << count_of(int64_t(lines.size()), "sample") << ", " << tokens << " tokens in "
            << secs << " s (" << (secs > 0 ? double(tokens) / secs : 0.0) << " tok/s)\n";
  return 0;
}

LS_REGISTER_COMMAND(Command{
    "generate",
    "sample responses for a JSONL of prompts with the rollout engine",
    std::string("usage: lockstep generate --model DIR --input PROMPTS.jsonl --output OUT.jsonl [flags]\n\n"
                "Input lines hold `text` (raw text; --chat wraps it in the chat template), `messages`\n"
                "(a chat) or `prompt_ids`. Each output line holds index, sample, prompt_ids, response_ids,\n"
                "logprobs (of the tempered, untruncated distribution), finish_reason (stop|length|abort),\n"
                "weight_version, the decoded `response`, and routed_experts with --return-experts (and for\n"
                "DeepSeek-V4 indexer_topk, the compressed entries each token chose in each CSA layer).\n"
                "The output is valid input to `lockstep score`. A PROMPTS file ending in .parquet is read\n"
                "as parquet, one row per prompt (`lockstep data` shows its rows).\n\nflags:\n") +
        rollout_flags_help() +
        "  --chat                 apply the tokenizer's chat template to `text`\n"
        "  --return-experts       include the MoE routing (and V4 indexer choices) of every token\n",
    {"chat", "return-experts", "ignore-eos", "no-prefix-cache"},
    run_generate});

}  // namespace
}  // namespace lockstep::cli
