// `lockstep demo`: the embedded end-to-end run. It builds a tiny MoE model and
// a synthetic, verifiable task (two-number addition answered in \boxed{}),
// warms the model up with SFT, evaluates held-out problems, runs GRPO with the
// RL loop of `lockstep rl`, evaluates again and prints a before/after table.
// Deterministic for a given seed and thread count.
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <random>
#include <sstream>

#include "lockstep/base/error.h"
#include "lockstep/base/file_util.h"
#include "lockstep/base/number_text.h"
#include "lockstep/base/timer.h"
#include "lockstep/cli/command.h"
#include "lockstep/cli/run_config.h"
#include "lockstep/data/dataset.h"
#include "lockstep/data/jsonl.h"
#include "lockstep/model/model_source.h"
#include "lockstep/model/pretrained.h"
#include "lockstep/parallel/dist_config.h"
#include "lockstep/rl/loop.h"
#include "lockstep/rl/report_hook.h"
#include "lockstep/rollout/rollout_config.h"
#include "lockstep/tokenizer/byte_level.h"
#include "lockstep/train/sft.h"

namespace lockstep::cli {
namespace {

struct Problem {
  int a = 0, b = 0;
  std::string prompt, answer;
};

constexpr int kMaxOperand = 50;

// `n` addition problems a+b with a, b in [0, kMaxOperand), drawn with seed and salt,
// none of them in `exclude` (so the held-out set stays held out).
std::vector<Problem> make_problems(int n, uint64_t seed, int salt, const std::vector<Problem>& exclude = {}) {
  std::mt19937_64 g(seed * 1000003u + uint64_t(salt));
  std::vector<bool> taken(size_t(kMaxOperand * kMaxOperand), false);
  for (const auto& p : exclude) taken[size_t(p.a * kMaxOperand + p.b)] = true;
  std::vector<Problem> out;
  while (int(out.size()) < n) {
    const int a = int(g() % kMaxOperand), b = int(g() % kMaxOperand);
    if (taken[size_t(a * kMaxOperand + b)]) continue;
    out.push_back({a, b, std::to_string(a) + "+" + std::to_string(b) + "=", std::to_string(a + b)});
  }
  return out;
}

// The SFT warm-up data comes from a teacher that often works the sum out in
// full ("28+45: 20+40=60, 8+5=13, 60+13=73, so \\boxed{73}"): right, but far
// longer than the 16-token answer budget of the RL and eval runs, so a model
// that imitates it is cut off before its answer. SFT copies the habit; RL with
// the math verifier (and DAPO's overlong penalty) has to learn to answer
// within the budget, which the demo measures on held-out problems.
std::string teacher_response(const Problem& p, double verbose_rate, std::mt19937_64& g) {
  const std::string boxed = "\\boxed{" + p.answer + "}";
  if (double(g() % 1000000) / 1e6 >= verbose_rate) return boxed;
  const int ta = p.a / 10 * 10, tb = p.b / 10 * 10, oa = p.a % 10, ob = p.b % 10;
  return std::to_string(p.a) + "+" + std::to_string(p.b) + ": " + std::to_string(ta) + "+" +
         std::to_string(tb) + "=" + std::to_string(ta + tb) + ", " + std::to_string(oa) + "+" +
         std::to_string(ob) + "=" + std::to_string(oa + ob) + ", " + std::to_string(ta + tb) + "+" +
         std::to_string(oa + ob) + "=" + p.answer + ", so " + boxed;
}

// The RL stage's config: the same text as configs/demo/rl.toml (a test
// checks they agree), with the model and data paths of the run directory.
constexpr const char* kDemoRlConfig = R"(# The RL stage of `lockstep demo` (GRPO on two-number addition).
# `lockstep demo` runs it after an SFT warm-up (into its --out directory);
# after `make demo` the RL stage can be run again on its own, into runs/demo-rl,
# with `lockstep rl --config configs/demo/rl.toml` (from any folder: its paths
# are taken from this file's folder, configs/demo/, so ../../ is the repository).
[model]
path = "../../runs/demo/sft/checkpoints/latest"
precision = "f32"      # both engines: aligned at f32, bf16 or fp8 (gap exactly 0)

[data]
train_file = "../../runs/demo/data/train.jsonl"
eval_file = "../../runs/demo/data/test.jsonl"
apply_chat_template = false

[rollout]
batch_size = 64        # prompts per step
n = 8                  # samples per prompt (the GRPO group)
temperature = 1.0
max_new_tokens = 16
kv_blocks = 4096
block_size = 16

[train]
steps = 50
lr = 3e-4
warmup_steps = 5
grad_clip = 1.0
micro_batch_tokens = 8192
save_interval = 25
keep_last = 2
seed = 1
out_dir = "../../runs/demo-rl"

[algo]
overlong_buffer_len = 4       # DAPO soft overlong penalty: responses past 12 tokens lose reward
overlong_penalty_factor = 1.0
advantage = "grpo"
policy_loss = "ppo"
eps_clip = 0.2
eps_clip_high = 0.28   # clip-higher (DAPO)
loss_agg = "token-mean"

[reward]
type = "math"

[eval]
name = "test"
n = 8
temperature = 1.0
max_new_tokens = 16
interval = 10

[log]
report_interval = 25
samples_interval = 10
samples_per_step = 16
)";

struct Figures {
  double pass1 = 0, pass8 = 0, truncated = 0, len_mean = 0;
};

Figures figures(const eval::EvalSummary& s) {
  Figures f;
  f.pass1 = s.pass_at_1;
  auto it = s.pass_at_k.find(8);
  f.pass8 = it != s.pass_at_k.end() ? it->second : 0.0;
  f.truncated = s.truncated_ratio;
  f.len_mean = s.response_len_mean;
  return f;
}

nlohmann::json figures_json(const Figures& f) {
  return {{"pass@1", f.pass1},
          {"pass@8", f.pass8},
          {"truncated_ratio", f.truncated},
          {"response_len_mean", f.len_mean}};
}

// The demo's options, read once.
struct DemoOptions {
  std::string out;
  uint64_t seed = 0;
  int64_t sft_steps = 600;
  std::string precision = "f32";
  double verbose_rate = 0.8;
  std::string arch = "qwen3-moe";  // or "deepseek-v4"
};

// The demo's DeepSeek-V4-style model at the same width as the Qwen3-MoE one:
// layer 0 window-only and hash-routed, layer 1 CSA (ratio 4, lightning
// indexer); mHC with 2 streams. (A ratio-128 layer would see its first entry
// only at the last of the 128 positions.)
void demo_v4_config(ModelConfig& c) {
  c.architecture = Architecture::DeepseekV4;
  c.num_kv_heads = 1;
  c.head_dim = 24;
  c.qk_rope_head_dim = 8;
  c.q_lora_rank = 48;
  c.o_groups = 2;
  c.o_lora_rank = 48;
  c.sliding_window = 32;
  c.compress_ratios = {0, 4};
  c.compress_rope_theta = 160000.0;
  c.index_n_heads = 2;
  c.index_head_dim = 16;
  c.index_topk = 4;
  c.n_shared_experts = 1;
  c.shared_expert_intermediate_size = c.moe_intermediate_size;
  c.router_scoring = RouterScoring::SqrtSoftplus;
  c.routed_scaling_factor = 1.5;
  c.score_correction_bias = true;
  c.num_hash_layers = 1;
  c.swiglu_limit = 10.0;
  c.hc_mult = 2;
  c.qk_norm = false;
}

// 1. A tiny Qwen3-MoE-shaped model with the byte-level tokenizer, written as a
// Hugging Face directory; returns its random initial parameters.
Buffer make_demo_model(const DemoOptions& o, const Context& ctx, const std::string& model_dir,
                       ModelConfig& c) {
  c.architecture = Architecture::Qwen3Moe;
  c.vocab_size = 272;  // 256 bytes + 3 specials, rounded up
  c.hidden_size = 96;
  c.num_layers = 2;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 24;
  c.qk_norm = true;
  c.num_experts = 4;
  c.num_experts_per_tok = 2;
  c.moe_intermediate_size = 96;
  c.norm_topk_prob = true;
  c.max_position_embeddings = 128;
  c.eos_token_ids = {258};  // <|im_end|>
  if (o.arch == "deepseek-v4") demo_v4_config(c);
  ParamLayout layout(c);
  Buffer params = alloc_params(layout);
  init_params(layout, params.as<float>(), o.seed, 0.02f, &ctx);
  save_pretrained(model_dir, c, layout, params.as<float>());
  tokenizer::write_byte_level_tokenizer(model_dir);
  std::cout << "lockstep demo: tiny " << (c.is_v4() ? "DeepSeek-V4-style MoE (" : "MoE (") << layout.numel()
            << " parameters, " << c.num_experts << " experts, top-" << c.num_experts_per_tok
            << "), task \"a+b=\" -> \\boxed{a+b}, " << ctx.threads() << " threads\n";
  return params;
}

// 2. The task, written as JSONL like any user dataset; returns the SFT
// warm-up sequences (the teacher's worked solutions).
std::vector<train::TrainSequence> write_demo_task(const DemoOptions& o, const tokenizer::Tokenizer& tok) {
  const auto test_set = make_problems(128, o.seed, 2), train_set = make_problems(4000, o.seed, 1, test_set);
  std::mt19937_64 teacher(o.seed + 7);
  auto write_set = [&](const std::string& path, const std::vector<Problem>& ps, bool with_response) {
    std::vector<nlohmann::json> lines;
    for (const auto& p : ps) {
      nlohmann::json j = {{"prompt", p.prompt}, {"label", p.answer}};
      if (with_response) j["response"] = teacher_response(p, o.verbose_rate, teacher);
      lines.push_back(std::move(j));
    }
    data::write_jsonl_atomic(path, lines);
  };
  write_set(o.out + "/data/train.jsonl", train_set, false);
  write_set(o.out + "/data/test.jsonl", test_set, false);
  write_set(o.out + "/data/sft.jsonl", train_set, true);
  data::DataConfig dc;
  dc.apply_chat_template = false;
  std::vector<train::TrainSequence> sft_data;
  for (const auto& e : data::load_sft_examples(o.out + "/data/sft.jsonl", dc, tok)) {
    train::TrainSequence s;
    s.tokens = e.prompt_ids;
    s.tokens.insert(s.tokens.end(), e.response_ids.begin(), e.response_ids.end());
    s.prompt_len = int32_t(e.prompt_ids.size());
    sft_data.push_back(std::move(s));
  }
  return sft_data;
}

// 3. SFT warm-up: the model learns the answer format and some arithmetic, in
// the policy's precision from the start. Returns its seconds.
double run_demo_sft(const DemoOptions& o, const Context& ctx, const ModelConfig& c, Buffer params,
                    const std::vector<train::TrainSequence>& sft_data, const std::string& model_dir) {
  train::TrainerConfig tc;
  tc.optim.lr = 3e-3;
  tc.optim.warmup_steps = 20;
  tc.optim.decay_steps = o.sft_steps;
  tc.optim.min_lr = 3e-4;
  tc.optim.weight_decay = 0.01;
  tc.precision = rollout::precision_dtype(o.precision);
  tc.in_place_weights = true;  // no rollout engine reads the SFT trainer's weights
  train::Trainer sft_trainer(ctx, c, std::move(params), tc);
  train::SftConfig sc;
  sc.steps = o.sft_steps;
  sc.batch_size = 32;
  sc.seed = o.seed;
  sc.log_interval = std::max<int64_t>(1, o.sft_steps / 5);
  sc.keep_last = 1;
  std::cout << "\n== SFT warm-up: " << count_of(o.sft_steps, "step") << " of 32 examples\n";
  Timer sft_timer;
  train::run_sft(sft_trainer, sft_data, o.out + "/sft", sc, false, model_dir);
  return sft_timer.seconds();
}

// 4a. The RL stage's config: the embedded text, the precision flags, the
// user's --set overrides and the run directory's paths.
toml::table demo_rl_config(const Args& args, const DemoOptions& o) {
  std::vector<std::string> sets = args.sets();
  if (o.precision != "f32")
    sets.push_back("model.precision=\"" + o.precision + "\"");  // aligned at that precision
  if (args.has("trainer-precision")) {                          // fast mode: correct the gap with TIS
    sets.push_back("model.trainer_precision=\"" + args.get("trainer-precision", "f32") + "\"");
    sets.push_back("algo.rollout_is=\"token\"");  // TIS: truncated importance weights
    sets.push_back("algo.rollout_is_mode=\"truncate\"");
  }
  if (args.has("rl-steps")) sets.push_back("train.steps=" + std::to_string(args.get_int("rl-steps", 50)));
  sets.push_back("train.out_dir=\"" + o.out + "\"");
  sets.push_back("model.path=\"" + o.out + "/sft/checkpoints/latest\"");
  sets.push_back("data.train_file=\"" + o.out + "/data/train.jsonl\"");
  sets.push_back("data.eval_file=\"" + o.out + "/data/test.jsonl\"");
  toml::table root = parse_toml_with_overrides(kDemoRlConfig, "demo config", sets);
  if (const auto* d = root["dist"].as_table())
    for (const auto& [key, value] : *d)
      if (key.str() != "max_weight_staleness" && key.str() != "rollout_threads")
        LS_THROW << "demo config: [dist] " << key.str() << " is not used by the demo (one process; only "
                 << "max_weight_staleness and rollout_threads are); run `lockstep rl` under mpirun for a "
                    "distributed run (docs/distributed.md)";
  return root;
}

// 4b. GRPO with the RL loop, starting from the SFT checkpoint.
rl::RlResult run_demo_rl(const Context& ctx, const toml::table& root, const rl::RlConfig& cfg,
                         const std::string& out, const TomlRecorder& rec) {
  LoadedModel m = load_model_from_config(root, "demo config", ctx);
  TomlSection data_s(root["data"].as_table(), "demo config", "data");
  const data::DataConfig rdc = data::data_config_from_toml(data_s);
  data_s.finish();
  rl::RlInputs in;
  in.tok = &*m.tokenizer;
  in.train = data::load_prompts(rdc.train_file, rdc, *m.tokenizer);
  in.eval = data::load_prompts(rdc.eval_file, rdc, *m.tokenizer);
  in.tokenizer_dir = m.dir;
  const nlohmann::json reward = cfg.reward.to_json();
  write_file_atomic(out + "/config.toml", saved_config_text(root, rec, cfg.out_dir, &reward));
  rl::attach_reports(in, cfg);
  const bool ppo = cfg.algo.advantage == rl::Advantage::Gae;  // --set algo.advantage="gae"
  std::cout << "\n== " << (ppo ? "PPO with a critic (GAE)" : "GRPO") << ": " << count_of(cfg.steps, "step")
            << " of " << count_of(cfg.batch_size, "prompt") << " x "
            << count_of(cfg.rollout.sampling.n, "sample") << ", precision " << cfg.rollout.precision
            << (cfg.rollout.aligned()
                    ? " (aligned)"
                    : " rollout vs " + cfg.rollout.trainer_precision + " trainer (fast mode)")
            << "; held-out eval: " << count_of(int64_t(in.eval.size()), "problem") << " x "
            << count_of(cfg.eval.config.n, "sample") << "\n";
  train::Trainer trainer(ctx, m.config, std::move(m.params), cfg.trainer);
  rl::RlResult r = rl::run_rl(trainer, in, cfg, false);
  LS_CHECK(r.first_eval && r.last_eval) << "demo: evaluation did not run";
  return r;
}

// A non-empty DIR holds a previous run (or anything else): replaced only with --force.
void refuse_used_directory(const std::string& out, bool force) {
  namespace fs = std::filesystem;
  if (force || !fs::exists(out)) return;
  if (!fs::is_directory(out)) LS_THROW << absolute_path(out) << ": --out exists and is not a directory";
  if (fs::directory_iterator(out) != fs::directory_iterator())
    LS_THROW << absolute_path(out)
             << ": --out is not empty (a previous run?); choose another directory, or add "
             << "--force to replace the demo's files in it";
}

// 5. The before/after table on the console and DIR/summary.json.
void report_demo(const DemoOptions& o, const rl::RlConfig& cfg, const rl::RlResult& r, double sft_s,
                 double total_s) {
  const Figures before = figures(*r.first_eval), after = figures(*r.last_eval);
  std::printf("\n%-36s %12s %12s %10s\n", "held-out (128 problems x 8 samples)", "after SFT", "after RL",
              "change");
  auto row = [](const char* name, double a, double b) {
    std::printf("%-36s %12.3f %12.3f %+10.3f\n", name, a, b, b - a);
  };
  row("pass@1", before.pass1, after.pass1);
  row("pass@8", before.pass8, after.pass8);
  row("truncated_ratio", before.truncated, after.truncated);
  row("response_len_mean", before.len_mean, after.len_mean);
  std::printf("%-36s %12.3g   (largest per-step mean; largest token |diff| %.3g)\n",
              "train/train_rollout_logprob_abs_diff", r.max_logprob_abs_diff, r.max_logprob_abs_diff_max);
  if (cfg.max_weight_staleness > 0)
    std::printf("%-36s %12s   (rollout one step ahead: samples one update old, an off-policy gap)\n", "", "");
  std::printf("\nmean seconds per RL step:");
  for (const auto& [k, v] : r.phase_seconds) std::printf(" %s %.3f", k.c_str(), v);
  std::printf("\nSFT %.1f s, RL %.1f s, total %.1f s. Run directory: %s (report.html, metrics.jsonl)\n",
              sft_s, r.seconds, total_s, o.out.c_str());
  nlohmann::json phases = nlohmann::json::object();
  for (const auto& [k, v] : r.phase_seconds) phases[k] = v;
  nlohmann::json summary = {{"before", figures_json(before)},
                            {"after", figures_json(after)},
                            {"train_rollout_logprob_abs_diff_max", r.max_logprob_abs_diff},
                            {"train_rollout_logprob_token_abs_diff_max", r.max_logprob_abs_diff_max},
                            {"rollout_precision", cfg.rollout.precision},
                            {"trainer_precision", cfg.rollout.trainer_precision},
                            {"seed", o.seed},
                            {"sft_steps", o.sft_steps},
                            {"rl_steps", cfg.steps},
                            {"sft_seconds", sft_s},
                            {"rl_seconds", r.seconds},
                            {"seconds_per_step", phases}};
  write_file_atomic(o.out + "/summary.json", summary.dump(2) + "\n");
}

int run_demo(const Args& args) {
  args.check_known({"out", "seed", "sft-steps", "rl-steps", "threads", "precision", "trainer-precision",
                    "arch", "device", "print-config", "teacher-verbose-rate", "force"});
  if (args.flag("print-config")) {
    std::cout << kDemoRlConfig;
    return 0;
  }
  DemoOptions o;
  o.out = args.get("out", "runs/demo");
  o.seed = uint64_t(args.get_int("seed", 0));
  o.sft_steps = args.get_int("sft-steps", 600);
  o.precision = args.get("precision", "f32");
  o.arch = args.get("arch", "qwen3-moe");
  if (o.arch != "qwen3-moe" && o.arch != "deepseek-v4")
    LS_THROW << "--arch must be qwen3-moe or deepseek-v4, got '" << o.arch << "'";
  o.verbose_rate = args.get_double("teacher-verbose-rate", 0.8);
  refuse_used_directory(o.out, args.flag("force"));
  auto pool = make_pool(threads_flag(args));
  Context ctx{pool.get(), 0};
  set_device(ctx, args);
  Timer total;
  // With --force a previous demo run there is replaced.
  for (const char* old :
       {"sft", "checkpoints", "samples", "eval", "metrics.jsonl", "report.html", "summary.json"})
    std::filesystem::remove_all(std::filesystem::path(o.out) / old);
  std::filesystem::create_directories(o.out + "/data");

  const std::string model_dir = o.out + "/model";
  ModelConfig c;
  Buffer params = make_demo_model(o, ctx, model_dir, c);
  const auto sft_data = write_demo_task(o, tokenizer::Tokenizer::load(model_dir));
  const double sft_s = run_demo_sft(o, ctx, c, std::move(params), sft_data, model_dir);
  TomlRecorder rec;  // every key's value, defaults included, for DIR/config.toml
  const toml::table root = demo_rl_config(args, o);
  rl::RlConfig cfg = rl::rl_config_from_toml(root, "demo config");
  TomlSection dist_s(root["dist"].as_table(), "demo config", "dist");
  const parallel::DistConfig dist = parallel::dist_config_from_toml(dist_s);
  dist_s.finish();
  cfg.max_weight_staleness = dist.max_weight_staleness;  // the rollout one step ahead, on threads of its own
  cfg.rollout_threads = dist.rollout_threads;
  const rl::RlResult r = run_demo_rl(ctx, root, cfg, o.out, rec);
  report_demo(o, cfg, r, sft_s, total.seconds());
  rl::finish_report(cfg);
  // One step ahead, samples come from the weights before the last update:
  // their gap is off-policy by design ([rl] on_gap checks the others).
  if (cfg.rollout.aligned() && cfg.max_weight_staleness == 0 && r.max_logprob_abs_diff_max != 0.0) {
    std::cout << "FAIL: rollout and trainer logprobs differ in aligned mode\n";
    return 1;
  }
  return 0;
}

LS_REGISTER_COMMAND(Command{
    "demo",
    "run the embedded end-to-end demo (SFT warm-up, then GRPO)",
    "usage: lockstep demo [--out DIR] [--seed N] [--sft-steps N] [--rl-steps N] [--threads N]\n"
    "                     [--precision f32|bf16|fp8] [--trainer-precision f32|bf16|fp8]\n"
    "                     [--teacher-verbose-rate R] [--arch qwen3-moe|deepseek-v4]\n"
    "                     [--device cpu|interpret|cuda|hip]\n"
    "                     [--set section.key=value ...] [--print-config] [--force]\n\n"
    "Builds a tiny MoE model (byte-level tokenizer; --arch deepseek-v4: a DeepSeek-V4-style\n"
    "one with mHC streams, a hash-routed layer and a CSA layer with its indexer) and a\n"
    "synthetic, verifiable task\n"
    "(\"a+b=\" with a, b < 50, answered as \\boxed{a+b}; 4000 training prompts, 128 held-out\n"
    "problems). The SFT warm-up data (--sft-steps, default 600) comes from a teacher that\n"
    "usually (--teacher-verbose-rate 0.8) works the sum out in full, which teaches the\n"
    "arithmetic but does not fit the 16-token answer budget; RL (GRPO with DAPO's overlong\n"
    "penalty, --rl-steps, default 50) must learn to answer within it. The held-out set is\n"
    "evaluated (8 samples each) after SFT, every 10 RL steps and at the end; the table\n"
    "compares pass@1, pass@8, truncated ratio, response length and the train/rollout\n"
    "logprob gap after SFT and after RL.\n"
    "--precision f32|bf16|fp8 (default f32) is the policy's precision, used by the SFT\n"
    "trainer, the rollout engine and the RL trainer alike (aligned mode: the gap must be\n"
    "exactly 0). --trainer-precision P trains the RL stage in P instead: fast mode, with\n"
    "TIS (token-level truncated importance weights) correcting the measured gap.\n"
    "--set overrides keys of the RL config (print it with --print-config; the same text is\n"
    "configs/demo/rl.toml); --set dist.max_weight_staleness=1 generates each RL step's batch\n"
    "while the previous step trains, on threads of its own (dist.rollout_threads). Writes DIR/model, "
    "DIR/data, DIR/sft (SFT metrics, checkpoint),\n"
    "DIR/metrics.jsonl, DIR/samples, DIR/eval, DIR/checkpoints, DIR/summary.json and\n"
    "DIR/report.html (DIR: default runs/demo). A DIR that exists and is not empty is refused\n"
    "unless --force, which replaces the demo's files in it. Exits 1 if aligned mode shows any\n"
    "train/rollout logprob difference.\n"
    "--device interpret runs every model kernel of SFT, rollout and RL through the GPU kernel\n"
    "sources on the CPU (the emulator; slow: use small --sft-steps/--rl-steps); the metrics\n"
    "equal the CPU run's (docs/gpu.md).\n",
    {"print-config", "force"},
    run_demo});

}  // namespace
}  // namespace lockstep::cli
