// `lockstep eval`: samples n responses per problem of a JSONL file, scores
// them with a verifier and reports pass@1, pass@k, truncation rate and
// response length (a summary table, summary JSON, per-problem JSONL).
#include <filesystem>
#include <iostream>

#include "lockstep/base/error.h"
#include "lockstep/base/file_util.h"
#include "lockstep/base/log.h"
#include "lockstep/base/number_text.h"
#include "lockstep/base/toml_section.h"
#include "lockstep/cli/command.h"
#include "lockstep/data/dataset.h"
#include "lockstep/data/jsonl.h"
#include "lockstep/eval/eval_config.h"
#include "lockstep/eval/eval_output.h"
#include "lockstep/eval/evaluator.h"
#include "lockstep/model/model_source.h"
#include "lockstep/model/weights.h"
#include "lockstep/rollout/engine.h"
#include "lockstep/rollout/rollout_config.h"

namespace lockstep::cli {
namespace {

const char* const kHelp =
    "usage: lockstep eval --model DIR --data FILE.jsonl [flags]\n"
    "       lockstep eval --config FILE [--set section.key=value ...] [flags]\n"
    "\n"
    "Samples --n responses to every prompt of FILE.jsonl with the rollout engine, scores each\n"
    "against the line's label with a verifier and prints pass@1 (mean correctness), pass@k for\n"
    "k = 1, 2, 4, ... <= n and k = n (unbiased estimator 1 - C(n-c,k)/C(n,k)), the truncation\n"
    "rate (finish reason \"length\"), the mean response length, reward failures and tokens/s.\n"
    "Responses whose scoring fails (timeout, bad label) are reported and never count as correct.\n"
    "Each line holds the prompt (or a messages list) and the label; see docs/eval.md.\n"
    "\n"
    "flags:\n"
    "  --model DIR            Hugging Face model directory with tokenizer.json\n"
    "  --data FILE            prompts JSONL (config: [data] eval_file)\n"
    "  --n N                  samples per problem (default 8)\n"
    "  --temperature T        sampling temperature (default 1; 0 = greedy)\n"
    "  --top-p P  --top-k K   nucleus / top-k truncation (default off)\n"
    "  --max-new-tokens N     response length limit (default 1024)\n"
    "  --seed S               sampling seed (default 0; problem i uses mix(S, i))\n"
    "  --reward TYPE          math | countdown | exact | remote | python (default math); python:\n"
    "                         a verl-style compute_score in a file, e.g. --reward python\n"
    "                         --reward-config '{\"path\": \"my_reward.py\"}' (docs/rewards.md)\n"
    "  --reward-config X      reward options: a JSON object, or a file holding one\n"
    "  --prompt-key K         prompt field (default prompt)\n"
    "  --label-key K          label field (default label)\n"
    "  --no-chat-template     feed the prompt text as is\n"
    "  --chat-template NAME   auto | chatml | llama3 | deepseek | raw (default auto)\n"
    "  --name NAME            set name in metric keys eval/NAME/... (default test)\n"
    "  --output FILE          per-problem JSONL (responses, rewards, finish reasons)\n"
    "  --summary FILE         summary JSON (every metric)\n"
    "  --threads N            compute threads (default: all cores)\n"
    "  --device D             cpu (default: [model] device) | interpret | cuda | hip (docs/gpu.md)\n"
    "  --kv-blocks N          KV cache blocks of 16 tokens (default 1024)\n"
    "  --max-batch-tokens N   tokens per engine step (default 2048)\n"
    "  --precision P          f32 | bf16 | fp8 weights (default: [model] precision, else f32)\n"
    "  --fp8-block B          fp8 scale block (default: [model] fp8_block, else 128)\n"
    "\n"
    "--config FILE reads [model] (path = DIR), [data] (eval_file, prompt_key, label_key, ...),\n"
    "[eval] (n, temperature, top_p, top_k, min_p, max_new_tokens, seed, name, output, summary,\n"
    "stop_token_ids, stop_at_end_of_turn) and [reward]; flags override the config. Other\n"
    "sections of an RL config ([rollout] [train] [algo] [sync] [dist] [log] [rl]) are ignored.\n"
    "Paths in FILE are taken from FILE's folder; paths in --set and flags from the current one.\n"
    "Output files are written to a temporary file and renamed. A bad data line stops the run\n"
    "with file:line (exit code 2).\n";

// Sections an RL config may hold that eval has no use for.
const std::vector<std::string> kIgnoredSections = {"rollout", "train", "algo", "sync", "dist", "log", "rl"};

nlohmann::json reward_config_json(const std::string& arg) {
  std::string text = arg;
  // Not JSON-looking and names a file: read it.
  std::error_code ec;
  if (!arg.empty() && arg.front() != '{' && std::filesystem::is_regular_file(arg, ec))
    text = read_file_text(arg);
  auto j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object())
    LS_THROW << "--reward-config: expected a JSON object or a file holding one, got '" << arg << "'";
  return j;
}

// The config file (if any) with the sections eval reads; source names it in messages.
struct EvalInputs {
  toml::table root;
  std::string source = "(flags)";
  data::DataConfig dc;
  eval::EvalSection es;
};

// Reads --config (with --set) and its [data] and [eval] sections.
EvalInputs load_config(const Args& args) {
  args.check_known(
      {"config", "device",        "model",      "precision", "fp8-block",        "data",
       "n",      "temperature",   "top-p",      "top-k",     "max-new-tokens",   "seed",
       "reward", "reward-config", "prompt-key", "label-key", "no-chat-template", "chat-template",
       "name",   "output",        "summary",    "threads",   "kv-blocks",        "max-batch-tokens"});
  if (!args.sets().empty() && !args.has("config")) LS_THROW << "--set needs --config";

  EvalInputs in;
  if (auto cfg = args.maybe("config")) {
    in.source = *cfg;
    in.root = load_toml_with_overrides(*cfg, args.sets());
    for (const auto& [k, v] : in.root) {
      const std::string key(k.str());
      bool ok = key == "model" || key == "data" || key == "eval" || key == "reward";
      for (const auto& s : kIgnoredSections) ok = ok || key == s;
      if (!ok)
        LS_THROW << in.source << ": section [" << key
                 << "] is not used by eval (expected [model] [data] [eval] [reward])";
    }
  }
  TomlSection data_s(in.root["data"].as_table(), in.source, "data");
  in.dc = data::data_config_from_toml(data_s);
  data_s.finish();
  TomlSection eval_s(in.root["eval"].as_table(), in.source, "eval");
  in.es = eval::eval_section_from_toml(eval_s);
  eval_s.finish();
  return in;
}

// [reward], with --reward and --reward-config on top.
reward::RewardOptions reward_options(const Args& args, const EvalInputs& in) {
  if (!args.has("reward-config") && !args.has("reward"))
    return eval::reward_options_from_toml(in.root["reward"].as_table(), in.source);
  // The flags' keys replace the config's, then the whole is checked once.
  nlohmann::json j = nlohmann::json::object();
  if (const toml::table* t = in.root["reward"].as_table()) j = eval::toml_to_json(*t);
  if (auto v = args.maybe("reward-config")) {
    const nlohmann::json flags = reward_config_json(*v);  // named: items() must not outlive it
    for (const auto& [k, val] : flags.items()) j[k] = val;
  }
  if (auto v = args.maybe("reward")) j["type"] = *v;
  try {
    return reward::RewardOptions::from_json(j);
  } catch (const Error& err) {
    LS_THROW << "reward options (--reward, --reward-config"
             << (in.root.contains("reward") ? ", [reward]" : "") << "): " << err.what();
  }
}

// Flags override the config; checked before the model loads so a bad flag fails fast.
void apply_flags(const Args& args, EvalInputs* in) {
  data::DataConfig& dc = in->dc;
  eval::EvalConfig& ec = in->es.config;
  if (auto v = args.maybe("data")) dc.eval_file = *v;
  if (dc.eval_file.empty()) LS_THROW << "no data: give --data FILE.jsonl (or [data] eval_file)";
  dc.prompt_key = args.get("prompt-key", dc.prompt_key);
  dc.label_key = args.get("label-key", dc.label_key);
  if (args.flag("no-chat-template")) dc.apply_chat_template = false;
  ec.n = args.get_int("n", ec.n);
  ec.sampling.temperature = float(args.get_double("temperature", ec.sampling.temperature));
  ec.sampling.top_p = float(args.get_double("top-p", ec.sampling.top_p));
  ec.sampling.top_k = args.get_int("top-k", ec.sampling.top_k);
  ec.sampling.max_new_tokens = args.get_int("max-new-tokens", ec.sampling.max_new_tokens);
  const int64_t seed = args.get_int("seed", int64_t(ec.seed));
  if (seed < 0) LS_THROW << "--seed must be >= 0, got " << seed;
  ec.seed = uint64_t(seed);
  ec.name = args.get("name", ec.name);
  in->es.output = args.get("output", in->es.output);
  in->es.summary = args.get("summary", in->es.summary);
  ec.validate();
}

rollout::EngineConfig engine_config(const Args& args) {
  rollout::EngineConfig engine_cfg;
  engine_cfg.num_blocks = args.get_int("kv-blocks", engine_cfg.num_blocks);
  engine_cfg.max_batch_tokens = args.get_int("max-batch-tokens", engine_cfg.max_batch_tokens);
  if (engine_cfg.num_blocks < 1 || engine_cfg.max_batch_tokens < 1)
    LS_THROW << "--kv-blocks and --max-batch-tokens must be >= 1";
  return engine_cfg;
}

// --model DIR, else [model] of the config; eval needs the tokenizer.
LoadedModel load_eval_model(const Args& args, const EvalInputs& in, const Context& ctx) {
  LoadedModel m;
  if (auto dir = args.maybe("model")) {
    m = load_model_dir(*dir, ctx, args.get("chat-template", "auto"));
  } else if (in.root.contains("model")) {
    if (args.has("chat-template"))
      LS_THROW << "--chat-template goes with --model; in a config use [model] chat_template";
    m = load_model_from_config(in.root, in.source, ctx);
  } else {
    LS_THROW << "no model: give --model DIR (or [model] path in --config)";
  }
  if (!m.tokenizer) LS_THROW << "the model has no tokenizer.json; eval needs one to build prompts and decode";
  return m;
}

// Bad lines fail here, before any generation (file:line in the message).
std::vector<data::PromptExample> load_problems(const data::DataConfig& dc, const LoadedModel& m,
                                               const reward::RewardOptions& reward) {
  auto problems = data::load_prompts(dc.eval_file, dc, *m.tokenizer, eval::prompt_needs(reward));
  for (const auto& p : problems)
    if (int64_t(p.prompt_ids.size()) >= m.config.max_position_embeddings)
      LS_THROW << dc.eval_file << ":" << p.line << ": the prompt has " << p.prompt_ids.size()
               << " tokens; the model's context is " << m.config.max_position_embeddings;
  return problems;
}

// The folder of an output file, made if missing (as a run directory is).
void make_parent(const std::string& file) {
  const std::filesystem::path parent = std::filesystem::path(file).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent);
}

// The per-problem JSONL and the summary JSON, when asked for.
void write_outputs(const EvalInputs& in, const LoadedModel& m, const eval::EvalSummary& summary,
                   const std::vector<eval::EvalProblemResult>& per_problem) {
  const eval::EvalSection& es = in.es;
  const eval::EvalConfig& ec = es.config;
  for (const std::string& f : {es.output, es.summary})
    if (!f.empty()) make_parent(f);
  if (!es.output.empty()) {
    std::vector<nlohmann::json> lines;
    lines.reserve(per_problem.size());
    for (const auto& p : per_problem) lines.push_back(eval::problem_to_json(p));
    data::write_jsonl_atomic(es.output, lines);
  }
  if (!es.summary.empty()) {
    nlohmann::json j = eval::summary_to_json(summary);
    j["data"] = in.dc.eval_file;
    j["model"] = m.dir;
    j["reward"] = ec.reward.to_json();
    j["temperature"] = ec.sampling.temperature;
    j["top_p"] = ec.sampling.top_p;
    j["max_new_tokens"] = ec.sampling.max_new_tokens;
    j["seed"] = ec.seed;
    write_file_atomic(es.summary, j.dump(2) + "\n");
  }
}

int run_eval(const Args& args) {
  EvalInputs in = load_config(args);
  eval::EvalConfig& ec = in.es.config;
  ec.reward = reward_options(args, in);
  apply_flags(args, &in);
  const rollout::EngineConfig engine_cfg = engine_config(args);

  auto pool = make_pool(threads_flag(args));
  Context ctx{pool.get(), 0};
  set_device(ctx, args, in.root.contains("model") ? device_from_toml(in.root, in.source) : "cpu");
  LoadedModel m = load_eval_model(args, in, ctx);
  auto problems = load_problems(in.dc, m, ec.reward);

  ParamLayout layout(m.config);
  // The policy's precision: --precision, else the config's [model] precision.
  const PrecisionConfig pc =
      in.root.contains("model") ? precision_from_toml(in.root, in.source) : PrecisionConfig{};
  const DType storage = rollout::precision_dtype(args.get("precision", pc.precision));
  model::ModelWeights weights(ctx, layout, m.params.as<float>(), storage,
                              args.get_int("fp8-block", pc.fp8_block));
  rollout::Engine engine(ctx, &weights, engine_cfg);
  eval::Evaluator evaluator(ec);
  std::cerr << "eval " << ec.name << ": " << count_of(int64_t(problems.size()), "problem") << " x "
            << count_of(ec.n, "sample") << " from " << in.dc.eval_file << " (" << ec.reward.type
            << " reward, temperature " << ec.sampling.temperature << ", max_new_tokens "
            << ec.sampling.max_new_tokens << ", " << count_of(ctx.threads(), "thread") << ")" << std::endl;
  std::vector<eval::EvalProblemResult> per_problem;
  eval::EvalSummary summary = evaluator.run(engine, *m.tokenizer, problems, &per_problem);

  write_outputs(in, m, summary, per_problem);
  std::cout << eval::format_summary_table(summary);
  if (!in.es.output.empty()) std::cout << "  per-problem         " << in.es.output << "\n";
  if (!in.es.summary.empty()) std::cout << "  summary             " << in.es.summary << "\n";
  return 0;
}

LS_REGISTER_COMMAND(Command{"eval",
                            "pass@k, truncation rate and response length of a model on a JSONL set",
                            kHelp,
                            {"no-chat-template"},
                            run_eval});

}  // namespace
}  // namespace lockstep::cli
