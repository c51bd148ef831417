// `lockstep reward`: scores a JSONL file of responses with a verifier (math,
// countdown, exact, remote, python) and writes the per-line verdicts plus a summary.
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>

#include "lockstep/base/error.h"
#include "lockstep/cli/command.h"
#include "lockstep/reward/jsonl.h"

namespace lockstep::cli {
namespace {

const char* const kHelp =
    "usage: lockstep reward --type math|countdown|exact|remote|python --input IN.jsonl --output OUT.jsonl [flags]\n"
    "\n"
    "Scores each line's \"response\" against its \"label\" (and \"metadata\", \"prompt\" if present) and\n"
    "writes OUT.jsonl: every input field plus \"reward\" (null when scoring failed), \"correct\",\n"
    "\"extracted\" and \"failure\" (null when none). Prints n, accuracy, mean reward, failures and\n"
    "responses/s. A bad line stops the run with file:line and writes nothing.\n"
    "\n"
    "flags:\n"
    "  --type T            reward type (default math)\n"
    "  --input FILE        input JSONL (required)\n"
    "  --output FILE       output JSONL (required; written as FILE.tmp, then renamed)\n"
    "  --options JSON      reward options as a JSON object (keys as in the [reward] section)\n"
    "  --set KEY=VALUE     one reward option (reward.KEY also accepted; VALUE parsed as JSON, else a string)\n"
    "  --extractors A,B    math/exact answer extractors, in order\n"
    "  --tolerance X       math: relative tolerance for inexact numbers (default 1e-6)\n"
    "  --format-reward X   reward of a found but wrong answer\n"
    "  --url URL           remote: endpoint (http://127.0.0.1:PORT/path)\n"
    "  --timeout S         per-sample time limit in seconds (default 10)\n"
    "  --threads N         scoring threads (default: hardware threads)\n"
    "  --path FILE         python: the reward file (relative to the current directory)\n"
    "  --function NAME     python: the function to call (default compute_score)\n"
    "  --workers N         python: worker processes (default min(4, hardware threads))\n"
    "  --python EXE        python: the interpreter (default python3, PATH is searched)\n"
    "\n"
    "See docs/rewards.md for every option, the equivalence rules and the remote protocol.\n";

nlohmann::json parse_value(const std::string& v) {
  auto j = nlohmann::json::parse(v, nullptr, /*allow_exceptions=*/false);
  return j.is_discarded() ? nlohmann::json(v) : j;
}

int run_reward(const Args& args) {
  args.check_known({"type", "input", "output", "options", "extractors", "tolerance", "format-reward", "url",
                    "timeout", "threads", "path", "function", "workers", "python"});
  nlohmann::json opts = nlohmann::json::object();
  if (auto o = args.maybe("options")) {
    opts = nlohmann::json::parse(*o, nullptr, false);
    if (!opts.is_object()) LS_THROW << "--options: expected a JSON object, got '" << *o << "'";
  }
  for (const auto& s : args.sets()) {
    auto eq = s.find('=');
    if (eq == std::string::npos) LS_THROW << "--set " << s << ": expected KEY=VALUE";
    std::string key = s.substr(0, eq);
    if (key.rfind("reward.", 0) == 0) key = key.substr(7);
    opts[key] = parse_value(s.substr(eq + 1));
  }
  if (auto v = args.maybe("type")) opts["type"] = *v;
  if (auto v = args.maybe("extractors")) opts["extractors"] = *v;
  if (args.has("tolerance")) opts["tolerance"] = args.get_double("tolerance", 0);
  if (args.has("format-reward")) opts["format_reward"] = args.get_double("format-reward", 0);
  if (auto v = args.maybe("url")) opts["url"] = *v;
  if (args.has("timeout")) opts["timeout_s"] = args.get_double("timeout", 0);
  if (args.has("threads")) opts["threads"] = static_cast<int>(args.get_int("threads", 0));
  if (auto v = args.maybe("path")) opts["path"] = *v;
  if (auto v = args.maybe("function")) opts["function"] = *v;
  if (args.has("workers")) opts["workers"] = static_cast<int>(args.get_int("workers", 0));
  if (auto v = args.maybe("python")) opts["python"] = *v;
  auto options = reward::RewardOptions::from_json(opts);

  std::string in = args.require("input"), out = args.require("output");
  auto summary = reward::score_jsonl_file(in, out, options, reward::batch_options_for(options));
  const auto& s = summary.stats;
  std::printf("reward type:    %s\n", options.type.c_str());
  std::printf("n:              %lld\n", static_cast<long long>(s.n));
  std::printf("accuracy:       %.4f (%lld correct)\n", s.accuracy(), static_cast<long long>(s.correct));
  std::printf("mean reward:    %.4f (over samples that did not fail)\n", s.reward_mean());
  std::printf("failures:       %lld", static_cast<long long>(s.failures));
  if (!s.failure_reasons.empty()) {
    std::printf(" (");
    bool first = true;
    for (const auto& [reason, count] : s.failure_reasons) {
      std::printf("%s%s: %lld", first ? "" : ", ", reason.c_str(), static_cast<long long>(count));
      first = false;
    }
    std::printf(")");
  }
  std::printf("\n");
  for (const auto& [key, sum] : s.extra_sum)  // python rewards: the dict's further numeric keys
    std::printf("reward/extra/%s: %.4f (mean over %lld)\n", key.c_str(), sum / double(s.extra_n.at(key)),
                static_cast<long long>(s.extra_n.at(key)));
  std::printf("responses/s:    %.1f\n", summary.responses_per_s);
  std::printf("output:         %s\n", out.c_str());
  return 0;
}

LS_REGISTER_COMMAND(Command{"reward", "score a JSONL file of responses with a verifier", kHelp, {}, run_reward});

}  // namespace
}  // namespace lockstep::cli
