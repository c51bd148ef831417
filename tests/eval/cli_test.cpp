// `lockstep eval` end to end: a model made by `lockstep init`, a small JSONL
// with exact-match labels, the summary JSON fields and the per-problem JSONL;
// the --config form; a bad data line exits with code 2 naming the line.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;

void write(const fs::path& p, const std::string& text) {
  std::ofstream f(p);
  f << text;
}

std::string read(const fs::path& p) {
  std::ifstream f(p);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::vector<std::string> lines(const fs::path& p) {
  std::vector<std::string> out;
  std::ifstream f(p);
  for (std::string l; std::getline(f, l);)
    if (!l.empty()) out.push_back(l);
  return out;
}

// Runs a shell command; returns its exit code (-1 if it did not exit normally).
int run(const std::string& cmd) {
  const int status = std::system(cmd.c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

class EvalCli : public ::testing::Test {
 protected:
  void SetUp() override {
    // ctest sets LOCKSTEP_BIN; run by hand from the build directory, ./lockstep is it.
    const char* b = std::getenv("LOCKSTEP_BIN");
    bin = b ? b : "./lockstep";
    if (!fs::exists(bin)) GTEST_SKIP() << "lockstep binary not built (" << bin << "; set LOCKSTEP_BIN)";
    bin = fs::absolute(bin).string();
    dir = fs::temp_directory_path() / ("lockstep_eval_cli_" + std::to_string(::getpid()));
    fs::create_directories(dir);
    write(dir / "model.toml",
          "[model]\narchitecture = \"Qwen3ForCausalLM\"\nvocab_size = 272\nhidden_size = 32\nnum_layers = 2\n"
          "num_heads = 4\nnum_kv_heads = 2\nhead_dim = 8\nintermediate_size = 48\nqk_norm = true\n"
          "max_position_embeddings = 256\ninit_seed = 5\ninit_std = 0.5\n");
    const std::string init = bin + " init --config " + (dir / "model.toml").string() + " --out " +
                             (dir / "model").string() + " --threads 1 > " + (dir / "init.log").string() +
                             " 2>&1";
    ASSERT_EQ(run(init), 0) << read(dir / "init.log");
    write(dir / "data.jsonl",
          "{\"prompt\": \"What is 1+1?\", \"label\": \"2\"}\n"
          "{\"prompt\": \"Say hi.\", \"label\": \"hi\"}\n"
          "\n"
          "{\"messages\": [{\"role\": \"user\", \"content\": \"Name a color.\"}], \"label\": \"red\", "
          "\"metadata\": {\"id\": 7}}\n");
  }
  void TearDown() override {
    if (!dir.empty()) fs::remove_all(dir);
  }

  std::string bin;
  fs::path dir;
};

TEST_F(EvalCli, WritesSummaryAndPerProblemFiles) {
  const fs::path per = dir / "per.jsonl", summary = dir / "summary.json", log = dir / "eval.log";
  const std::string cmd =
      bin + " eval --model " + (dir / "model").string() + " --data " + (dir / "data.jsonl").string() +
      " --n 4 --max-new-tokens 8 --reward exact --threads 2 --name tiny --seed 3 --output " + per.string() +
      " --summary " + summary.string() + " > " + log.string() + " 2>&1";
  ASSERT_EQ(run(cmd), 0) << read(log);
  const std::string out = read(log);
  for (const char* want : {"pass@1", "pass@2", "pass@4", "truncated ratio", "response length",
                           "reward failures", "problems", "samples", "tokens/s"})
    EXPECT_NE(out.find(want), std::string::npos) << want << " missing from:\n" << out;

  const auto s = nlohmann::json::parse(read(summary));
  EXPECT_EQ(s["name"], "tiny");
  EXPECT_EQ(s["num_problems"], 3);
  EXPECT_EQ(s["num_samples"], 12);
  EXPECT_EQ(s["n"], 4);
  EXPECT_EQ(s["reward_failures"], 0);
  EXPECT_EQ(s["pass@k"].size(), 3u);  // k = 1, 2, 4
  EXPECT_EQ(s["pass@1"], s["pass@k"]["1"]);
  const double trunc = s["truncated_ratio"], len = s["response_len_mean"];
  EXPECT_GE(trunc, 0.0);
  EXPECT_LE(trunc, 1.0);
  EXPECT_GT(len, 0.0);
  EXPECT_LE(len, 8.0);
  EXPECT_TRUE(s["metrics"].contains("eval/tiny/pass@4"));
  EXPECT_TRUE(s["metrics"].contains("eval/tiny/truncated_ratio"));
  EXPECT_EQ(s["reward"]["type"], "exact");

  const auto ls = lines(per);
  ASSERT_EQ(ls.size(), 3u);
  int64_t truncated = 0, tokens = 0;
  const std::vector<int64_t> want_lines = {1, 2, 4};  // line 3 is blank
  for (size_t i = 0; i < ls.size(); ++i) {
    const auto p = nlohmann::json::parse(ls[i]);
    EXPECT_EQ(p["line"], want_lines[i]);
    EXPECT_EQ(p["n"], 4);
    ASSERT_EQ(p["samples"].size(), 4u);
    EXPECT_TRUE(p["pass@k"].contains("4"));
    for (const auto& smp : p["samples"]) {
      EXPECT_TRUE(smp["finish_reason"] == "stop" || smp["finish_reason"] == "length") << smp.dump();
      EXPECT_TRUE(smp["failure"].is_null());
      truncated += smp["finish_reason"] == "length";
      tokens += smp["length"].get<int64_t>();
    }
  }
  EXPECT_EQ(nlohmann::json::parse(ls[2])["metadata"]["id"], 7);
  EXPECT_EQ(nlohmann::json::parse(ls[1])["label"], "hi");
  // The summary agrees with the per-problem file.
  EXPECT_DOUBLE_EQ(trunc, double(truncated) / 12.0);
  EXPECT_DOUBLE_EQ(len, double(tokens) / 12.0);
}

TEST_F(EvalCli, ConfigFileWithOverrides) {
  const fs::path summary = dir / "s.json", log = dir / "cfg.log";
  write(dir / "eval.toml", "[model]\npath = \"" + (dir / "model").string() + "\"\n[data]\neval_file = \"" +
                               (dir / "data.jsonl").string() +
                               "\"\n[eval]\nname = \"cfg\"\nn = 2\nsummary = \"" + summary.string() +
                               "\"\n[reward]\ntype = \"exact\"\n[train]\nlr = 1e-5\n");
  std::string cmd = bin + " eval --config " + (dir / "eval.toml").string() +
                    " --set eval.max_new_tokens=4 --threads 2 > " + log.string() + " 2>&1";
  ASSERT_EQ(run(cmd), 0) << read(log);
  const auto s = nlohmann::json::parse(read(summary));
  EXPECT_EQ(s["name"], "cfg");
  EXPECT_EQ(s["num_samples"], 6);
  EXPECT_EQ(s["max_new_tokens"], 4);
  EXPECT_LE(s["response_len_mean"].get<double>(), 4.0);
  // An unknown [eval] key: exit 2, the key named.
  cmd = bin + " eval --config " + (dir / "eval.toml").string() + " --set eval.samples=3 > " + log.string() +
        " 2>&1";
  EXPECT_EQ(run(cmd), 2);
  EXPECT_NE(read(log).find("unknown key 'samples' in [eval]"), std::string::npos) << read(log);
}

TEST_F(EvalCli, BadDataLineExitsWithCode2AndNamesTheLine) {
  write(dir / "bad.jsonl", "{\"prompt\": \"ok\", \"label\": \"1\"}\n{\"prompt\": \"broken\", \n");
  const fs::path per = dir / "bad_out.jsonl", log = dir / "bad.log";
  std::string cmd = bin + " eval --model " + (dir / "model").string() + " --data " +
                    (dir / "bad.jsonl").string() + " --n 2 --max-new-tokens 4 --output " + per.string() +
                    " > " + log.string() + " 2>&1";
  EXPECT_EQ(run(cmd), 2) << read(log);
  EXPECT_NE(read(log).find("bad.jsonl:2:"), std::string::npos) << read(log);
  EXPECT_FALSE(fs::exists(per));
  // A line without a prompt also names its line.
  write(dir / "bad.jsonl", "{\"prompt\": \"ok\", \"label\": \"1\"}\n{\"question\": \"x\"}\n");
  EXPECT_EQ(run(cmd), 2) << read(log);
  EXPECT_NE(read(log).find("bad.jsonl:2: missing field 'prompt'"), std::string::npos) << read(log);
  // Bad flags fail before any work.
  cmd = bin + " eval --model " + (dir / "model").string() + " --data " + (dir / "data.jsonl").string() +
        " --n 0 > " + log.string() + " 2>&1";
  EXPECT_EQ(run(cmd), 2);
  EXPECT_NE(read(log).find("eval.n"), std::string::npos) << read(log);
}

}  // namespace
