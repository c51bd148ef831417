// Tests for JSONL scoring (the engine of `lockstep reward`): output fields,
// errors naming file and line, nothing half-written; and, when the binary is
// built, the CLI itself.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <unistd.h>

#include "lockstep/base/error.h"
#include "lockstep/reward/jsonl.h"

namespace lockstep::reward {
namespace {

namespace fs = std::filesystem;

std::string temp_dir(const std::string& name) {
  fs::path p = fs::path(testing::TempDir()) / ("lockstep_reward_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(p);
  fs::create_directories(p);
  return p.string();
}

void write(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary);
  f << text;
}

std::vector<nlohmann::ordered_json> read_lines(const std::string& path) {
  std::ifstream f(path);
  std::vector<nlohmann::ordered_json> out;
  std::string line;
  while (std::getline(f, line)) out.push_back(nlohmann::ordered_json::parse(line));
  return out;
}

TEST(Jsonl, ScoresAndWritesFields) {
  std::string dir = temp_dir("ok");
  std::string in = dir + "/in.jsonl", out = dir + "/out.jsonl";
  write(in,
        "{\"id\": 1, \"response\": \"so \\\\boxed{4}\", \"label\": \"4\"}\n"
        "\n"
        "{\"id\": 2, \"response\": \"so \\\\boxed{5}\", \"label\": \"4\", \"metadata\": {\"src\": \"x\"}}\n"
        "{\"id\": 3, \"response\": \"no answer\", \"label\": {\"bad\": true}}\r\n");
  RewardOptions o;
  auto summary = score_jsonl_file(in, out, o, BatchOptions{2, 10.0, 1.0});
  EXPECT_EQ(summary.stats.n, 3);
  EXPECT_EQ(summary.stats.correct, 1);
  EXPECT_EQ(summary.stats.failures, 1);
  EXPECT_GT(summary.responses_per_s, 0.0);
  auto rows = read_lines(out);
  ASSERT_EQ(rows.size(), 3u);
  // Input fields first, in their order, then the verdict.
  std::vector<std::string> keys;
  for (auto it = rows[1].begin(); it != rows[1].end(); ++it) keys.push_back(it.key());
  EXPECT_EQ(keys, (std::vector<std::string>{"id", "response", "label", "metadata", "reward", "correct", "extracted",
                                            "failure"}));
  EXPECT_EQ(rows[0]["reward"], 1.0);
  EXPECT_EQ(rows[0]["correct"], true);
  EXPECT_EQ(rows[0]["extracted"], "4");
  EXPECT_TRUE(rows[0]["failure"].is_null());
  EXPECT_EQ(rows[1]["correct"], false);
  EXPECT_EQ(rows[1]["extracted"], "5");
  EXPECT_TRUE(rows[2]["reward"].is_null());  // failed: no reward
  EXPECT_EQ(rows[2]["failure"].get<std::string>().rfind("bad_label", 0), 0u);
  EXPECT_FALSE(fs::exists(out + ".tmp"));
  fs::remove_all(dir);
}

void expect_error(const std::string& content, const std::string& want) {
  std::string dir = temp_dir("bad");
  std::string in = dir + "/in.jsonl", out = dir + "/out.jsonl";
  write(in, content);
  write(out, "previous contents\n");
  try {
    score_jsonl_file(in, out, RewardOptions{}, BatchOptions{1, 10.0, 1.0});
    FAIL() << "no error for: " << content;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
  }
  // Nothing half-written: the old output is intact and no temp file is left.
  std::ifstream f(out);
  std::stringstream ss;
  ss << f.rdbuf();
  EXPECT_EQ(ss.str(), "previous contents\n");
  EXPECT_FALSE(fs::exists(out + ".tmp"));
  fs::remove_all(dir);
}

TEST(Jsonl, BadLinesNameFileAndLine) {
  expect_error("{\"response\": \"a\", \"label\": \"1\"}\n{not json}\n", "in.jsonl:2: not valid JSON");
  expect_error("{\"label\": \"1\"}\n", "in.jsonl:1: missing field 'response'");
  expect_error("{\"response\": \"a\"}\n", "in.jsonl:1: missing field 'label'");
  expect_error("\n\n{\"response\": 5, \"label\": \"1\"}\n", "in.jsonl:3: field 'response' must be a string");
  expect_error("[1, 2]\n", "in.jsonl:1: expected a JSON object");
  // A number past double's range is nlohmann's out_of_range, not parse_error;
  // it escaped as a non-Error.
  expect_error("{\"response\": \"a\", \"label\": 1e400}\n", "in.jsonl:1: not valid JSON");
}

TEST(Jsonl, MissingInputFile) {
  std::string dir = temp_dir("missing");
  EXPECT_THROW(score_jsonl_file(dir + "/nope.jsonl", dir + "/out.jsonl", RewardOptions{}, BatchOptions{}), Error);
  EXPECT_FALSE(fs::exists(dir + "/out.jsonl"));
  fs::remove_all(dir);
}

TEST(Jsonl, CommandLine) {
  const char* bin = std::getenv("LOCKSTEP_BIN");
  if (!bin || !fs::exists(bin)) GTEST_SKIP() << "lockstep binary not built";
  std::string dir = temp_dir("cli");
  std::string in = dir + "/in.jsonl", out = dir + "/out.jsonl", log = dir + "/log.txt";
  write(in,
        "{\"response\": \"<answer>2*3*4</answer>\", \"label\": {\"target\": 24, \"numbers\": [2, 3, 4]}}\n"
        "{\"response\": \"<answer>2+3+4</answer>\", \"label\": {\"target\": 24, \"numbers\": [2, 3, 4]}}\n");
  std::string cmd = std::string(bin) + " reward --type countdown --input " + in + " --output " + out + " > " + log +
                    " 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  std::ifstream f(log);
  std::stringstream ss;
  ss << f.rdbuf();
  EXPECT_NE(ss.str().find("accuracy:       0.5000"), std::string::npos) << ss.str();
  EXPECT_NE(ss.str().find("responses/s"), std::string::npos) << ss.str();
  EXPECT_EQ(read_lines(out).size(), 2u);
  // A bad line: exit code 2, message with file:line, no output.
  write(in, "{\"response\": \"x\"}\n");
  std::string bad = std::string(bin) + " reward --input " + in + " --output " + dir + "/o2.jsonl > " + log + " 2>&1";
  EXPECT_NE(std::system(bad.c_str()), 0);
  std::ifstream g(log);
  std::stringstream gs;
  gs << g.rdbuf();
  EXPECT_NE(gs.str().find("in.jsonl:1: missing field 'label'"), std::string::npos) << gs.str();
  EXPECT_FALSE(fs::exists(dir + "/o2.jsonl"));
  fs::remove_all(dir);
}

}  // namespace
}  // namespace lockstep::reward
