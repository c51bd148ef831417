// JSONL reading of datasets: errors name the file and the line.
#include "lockstep/data/jsonl.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "lockstep/base/error.h"

namespace lockstep::data {
namespace {

namespace fs = std::filesystem;

std::string write_temp(const std::string& name, const std::string& text) {
  const fs::path p = fs::temp_directory_path() / ("lockstep_data_" + std::to_string(::getpid()) + "_" + name);
  std::ofstream(p, std::ios::binary) << text;
  return p.string();
}

void expect_error(const std::string& text, const std::string& needle) {
  const std::string path = write_temp("in.jsonl", text);
  try {
    read_jsonl(path);
    ADD_FAILURE() << "expected an Error mentioning " << needle;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
  fs::remove(path);
}

TEST(Jsonl, ReadsObjectsWithLineNumbers) {
  const std::string path =
      write_temp("ok.jsonl", "{\"prompt\": \"a\"}\n\n  \n{\"prompt\": \"b\", \"ids\": [1, 2]}\n");
  const auto records = read_jsonl(path);
  ASSERT_EQ(records.size(), 2u);
  EXPECT_EQ(records[0].line, 1);
  EXPECT_EQ(records[1].line, 4);
  EXPECT_EQ(require_string(records[1], path, "prompt"), "b");
  EXPECT_EQ(require_ids(records[1], path, "ids"), (std::vector<int32_t>{1, 2}));
  fs::remove(path);
}

TEST(Jsonl, BadLinesNameFileAndLine) {
  expect_error("{\"prompt\": \"a\"}\n{not json}\n", "in.jsonl:2: not valid JSON");
  expect_error("[1, 2]\n", "in.jsonl:1: expected a JSON object, got array");
}

// Found by tests/fuzz/targets/jsonl.cpp: a number past double's range is
// nlohmann's out_of_range (not parse_error) and escaped as a non-Error.
TEST(Jsonl, NumberOverflowIsAnError) {
  expect_error("{\"prompt\": \"a\", \"label\": 1e400}\n", "in.jsonl:1: not valid JSON");
  expect_error("{\"prompt\": \"a\"}\n{\"label\": -1e999}\n", "in.jsonl:2: not valid JSON");
}

}  // namespace
}  // namespace lockstep::data
