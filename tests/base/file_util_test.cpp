// Tests for base/file_util.h: the sweep of AtomicFile temporaries that
// killed writers left behind.
#include "lockstep/base/file_util.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace lockstep {
namespace {

namespace fs = std::filesystem;

TEST(FileUtil, RemovesOnlyTheTemporariesOfDeadWriters) {
  const fs::path dir = fs::temp_directory_path() / ("lockstep-stale-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const pid_t dead = ::fork();  // a pid whose process is gone
  ASSERT_GE(dead, 0);
  if (dead == 0) std::_Exit(0);
  ASSERT_EQ(::waitpid(dead, nullptr, 0), dead);
  const std::string me = std::to_string(::getpid()), gone = std::to_string(dead);
  for (const std::string& n : std::vector<std::string>{"report.html.tmp." + gone + ".3", "metrics.jsonl.tmp." + me + ".0",
                                                     "step_1.jsonl.tmp", "notes.tmp.x.1", "config.toml"})
    std::ofstream(dir / n) << "x";
  fs::create_directories(dir / ("sub.tmp." + gone + ".0"));  // a directory: not an AtomicFile's
  EXPECT_EQ(remove_stale_temporaries(dir.string()), 1);
  std::vector<std::string> left;
  for (const auto& e : fs::directory_iterator(dir)) left.push_back(e.path().filename().string());
  std::sort(left.begin(), left.end());
  EXPECT_EQ(left, (std::vector<std::string>{"config.toml", "metrics.jsonl.tmp." + me + ".0", "notes.tmp.x.1",
                                            "step_1.jsonl.tmp", "sub.tmp." + gone + ".0"}));
  EXPECT_EQ(remove_stale_temporaries((dir / "missing").string()), 0);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace lockstep
