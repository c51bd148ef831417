// Tests for the config path rule, the recorder of every key's value and the
// TOML writer (base/toml_section.h, base/toml_text.h, base/number_text.h).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>

#include "lockstep/base/error.h"
#include "lockstep/base/number_text.h"
#include "lockstep/base/toml_section.h"
#include "lockstep/base/toml_text.h"

namespace lockstep {
namespace {

namespace fs = std::filesystem;

std::string str(const toml::table& t, const char* section, const char* key) {
  return t[section][key].value_or(std::string("<absent>"));
}

TEST(ConfigPaths, FilePathsAreTheFilesFolderAndSetPathsTheCurrentFolder) {
  const fs::path dir = fs::temp_directory_path() / ("lockstep-paths-" + std::to_string(::getpid())) / "sub";
  fs::create_directories(dir);
  std::ofstream(dir / "rl.toml")
      << "[model]\npath = \"../models/m\"\n[data]\ntrain_file = \"train.jsonl\"\n"
         "eval_file = \"/abs/test.jsonl\"\nprompt_key = \"q\"\n[train]\nout_dir = \"run\"\n";
  const toml::table t =
      load_toml_with_overrides((dir / "rl.toml").string(), {"data.eval_file=e.jsonl", "data.label_key=a/b"});
  EXPECT_EQ(str(t, "model", "path"), (dir.parent_path() / "models/m").string());
  EXPECT_EQ(str(t, "data", "train_file"), (dir / "train.jsonl").string());
  EXPECT_EQ(str(t, "train", "out_dir"), (dir / "run").string());
  EXPECT_EQ(str(t, "data", "eval_file"), (fs::current_path() / "e.jsonl").string());  // --set: this folder's
  EXPECT_EQ(str(t, "data", "prompt_key"), "q");                                       // not a path
  EXPECT_EQ(str(t, "data", "label_key"), "a/b");
  // A relative config path: the same rule, made absolute.
  const fs::path here = fs::current_path();
  fs::current_path(dir.parent_path());
  const toml::table r = load_toml_with_overrides("sub/rl.toml", {});
  fs::current_path(here);
  EXPECT_EQ(str(r, "data", "train_file"), (dir / "train.jsonl").string());
  fs::remove_all(dir.parent_path());
}

TEST(ConfigPaths, AConfigThatCannotBeOpenedIsNamedByItsFullPath) {
  try {
    load_toml_with_overrides("no-such-dir/x.toml", {});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find((fs::current_path() / "no-such-dir/x.toml").string()),
              std::string::npos)
        << e.what();
  }
}

TEST(ConfigPaths, TextWithoutAFolderKeepsItsPathsAndUrlsAreNoPaths) {
  const toml::table t =
      parse_toml_with_overrides("[data]\ntrain_file = \"t.jsonl\"\n[reward]\npath = \"\"\n", "x", {});
  EXPECT_EQ(str(t, "data", "train_file"), "t.jsonl");
  toml::table u =
      parse_toml_with_overrides("[model]\npath = \"http://host/m\"\n[reward]\npath = \"\"\n", "x", {}, "/c");
  EXPECT_EQ(str(u, "model", "path"), "http://host/m");
  EXPECT_EQ(str(u, "reward", "path"), "");
}

TEST(TomlRecorder, CompletesAConfigWithTheDefaultsItsReadersTook) {
  const toml::table root = parse_toml_with_overrides("[train]\nlr = 1e-5\n", "x.toml", {});
  TomlRecorder rec;
  {
    TomlSection s(root["train"].as_table(), "x.toml", "train");
    EXPECT_EQ(s.get_double("lr", 3e-4), 1e-5);
    EXPECT_EQ(s.get_int("steps", 7), 7);
    EXPECT_EQ(s.get_string("name", "n"), "n");
    EXPECT_EQ(s.get_int_list("ids", {1, 2}), (std::vector<int64_t>{1, 2}));
    TomlSection d(nullptr, "x.toml", "dist");
    EXPECT_EQ(d.get_int("trainer_ranks", 0), 0);
    TomlSection l(nullptr, "x.toml", "log");
    EXPECT_TRUE(l.get_bool("progress", true));
  }
  const toml::table full = rec.complete(root, {"dist"});
  EXPECT_EQ(full["train"]["lr"].value<double>(), 1e-5);  // the config's value stays
  EXPECT_EQ(full["train"]["steps"].value<int64_t>(), 7);
  EXPECT_EQ(str(full, "train", "name"), "n");
  EXPECT_EQ(full["train"]["ids"].as_array()->size(), 2u);
  EXPECT_EQ(full["log"]["progress"].value<bool>(), true);
  EXPECT_FALSE(full.contains("dist"));  // absent, and only completed when present
  EXPECT_EQ(TomlRecorder::active(), &rec);
}

TEST(TomlText, WritesFloatsInTheirShortestExactFormAndReadsBackEqual) {
  toml::table t = parse_toml_with_overrides(
      "top = 1\n[train]\nlr = 3e-4\nclip = 1.0\ntiny = 1e-20\nbig = inf\nname = \"a \\\"q\\\"\"\nids = [1, "
      "2]\n"
      "[a.b]\n\"odd key\" = [{ x = 0.1 }]\n",
      "x.toml", {});
  const std::string text = toml_text(t);
  EXPECT_NE(text.find("lr = 0.0003\n"), std::string::npos) << text;
  EXPECT_NE(text.find("clip = 1.0\n"), std::string::npos) << text;
  EXPECT_NE(text.find("tiny = 1e-20\n"), std::string::npos) << text;
  EXPECT_NE(text.find("big = inf\n"), std::string::npos) << text;
  EXPECT_NE(text.find("x = 0.1 "), std::string::npos) << text;
  EXPECT_EQ(text.find("00000"), std::string::npos) << text;
  EXPECT_EQ(text.rfind("top = 1\n", 0), 0u) << text;
  const toml::table back = parse_toml_with_overrides(text, "back.toml", {});
  EXPECT_EQ(back, t) << text;
}

TEST(NumberText, ShortestRoundTripsAndCountsAgree) {
  EXPECT_EQ(shortest(3e-4), "0.0003");
  EXPECT_EQ(shortest(0.1 + 0.2), "0.30000000000000004");
  EXPECT_EQ(shortest(2.0), "2");
  EXPECT_EQ(shortest(INFINITY), "inf");
  EXPECT_EQ(shortest(-INFINITY), "-inf");
  EXPECT_EQ(count_of(1, "sample"), "1 sample");
  EXPECT_EQ(count_of(0, "sample"), "0 samples");
  EXPECT_EQ(count_of(8, "problem"), "8 problems");
}

}  // namespace
}  // namespace lockstep
