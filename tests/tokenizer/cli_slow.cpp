// Runs the `lockstep tokenize` command (LOCKSTEP_BIN or ./lockstep) on a
// byte-level tokenizer written by the test: --text, --ids and the JSONL batch
// form, including the error for a malformed line. Skipped without the binary.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <sys/wait.h>
#include <fstream>
#include <sstream>

#include "fixtures.h"

namespace lockstep::tokenizer {
namespace {

struct CmdResult {
  int status;
  std::string output;
};

CmdResult run(const std::string& cmd) {
  CmdResult r{-1, ""};
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) r.output.append(buf, n);
  int st = pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

// LOCKSTEP_BIN, else ./lockstep (ctest runs tests in the build directory).
std::string binary() {
  const char* b = std::getenv("LOCKSTEP_BIN");
  if (b != nullptr && std::filesystem::exists(b)) return b;
  std::filesystem::path local = std::filesystem::current_path() / "lockstep";
  if (std::filesystem::exists(local)) return local.string();
  return "";
}

TEST(TokenizeCli, TextIdsAndBatch) {
  std::string bin = binary();
  if (bin.empty()) GTEST_SKIP() << "LOCKSTEP_BIN not built";
  test::TempDir dir;
  write_byte_level_tokenizer(dir.path());
  std::string tok = " --tokenizer " + dir.path().string();

  CmdResult r = run(bin + " tokenize" + tok + " --text 'hi<|im_end|>'");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("[104,105,258]"), std::string::npos) << r.output;

  r = run(bin + " tokenize" + tok + " --ids 104,105,258 --skip-special-tokens");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(r.output, "hi\n");

  dir.write("in.jsonl",
            "{\"text\": \"ab\", \"id\": 1}\n\n{\"messages\": [{\"role\": \"user\", \"content\": \"q\"}]}\n"
            "{\"text\": \"<|endoftext|>\\u00e9\"}\n");
  std::string out = (dir.path() / "out.jsonl").string();
  r = run(bin + " tokenize" + tok + " --input " + (dir.path() / "in.jsonl").string() + " --output " + out);
  ASSERT_EQ(r.status, 0) << r.output;
  std::ifstream f(out);
  std::stringstream ss;
  ss << f.rdbuf();
  EXPECT_EQ(ss.str(),
            "{\"text\":\"ab\",\"id\":1,\"ids\":[97,98]}\n"
            "{\"messages\":[{\"role\":\"user\",\"content\":\"q\"}],\"ids\":[257,117,115,101,114,10,113,258,10,257,97,"
            "115,115,105,115,116,97,110,116,10]}\n"
            "{\"text\":\"<|endoftext|>\xC3\xA9\",\"ids\":[256,195,169]}\n");

  dir.write("bad.jsonl", "{\"text\": \"ok\"}\n{\"text\": 5}\n");
  std::string bad_out = (dir.path() / "bad_out.jsonl").string();
  r = run(bin + " tokenize" + tok + " --input " + (dir.path() / "bad.jsonl").string() + " --output " + bad_out);
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.output.find("bad.jsonl:2"), std::string::npos) << r.output;
  EXPECT_FALSE(std::filesystem::exists(bad_out));
  EXPECT_FALSE(std::filesystem::exists(bad_out + ".tmp"));
}

}  // namespace
}  // namespace lockstep::tokenizer
