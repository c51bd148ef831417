// Dataset rows as RL, eval and SFT read them: a row without the label its
// reward needs is refused naming file, line, field and [data] key; verl's
// layout loads as it is (message-list prompt, dotted keys, top-level
// data_source / extra_info in the metadata).
#include "lockstep/data/dataset.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "lockstep/base/error.h"
#include "lockstep/data/fields.h"
#include "lockstep/eval/eval_config.h"
#include "lockstep/reward/python_reward.h"
#include "lockstep/tokenizer/byte_level.h"

namespace lockstep::data {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

class Dataset : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("lockstep_dataset_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
    tokenizer::write_byte_level_tokenizer(dir_ / "tok");
    tok_.emplace(tokenizer::Tokenizer::load(dir_ / "tok"));
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string write(const std::string& name, const std::string& text) {
    const fs::path p = dir_ / name;
    std::ofstream(p, std::ios::binary) << text;
    return p.string();
  }

  // The message of the Error that loading `text` throws ("" when none).
  std::string load_error(const std::string& text, const DataConfig& cfg, const PromptNeeds& needs) {
    const std::string path = write("train.jsonl", text);
    try {
      load_prompts(path, cfg, *tok_, needs);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  }

  fs::path dir_;
  std::optional<tokenizer::Tokenizer> tok_;
};

reward::RewardOptions reward_of(const std::string& type) {
  reward::RewardOptions o;
  o.type = type;
  return o;
}

TEST_F(Dataset, MissingLabelIsRefusedNamingFileLineFieldAndKey) {
  const std::string rows =
      "{\"prompt\": \"1+1=\", \"label\": \"2\"}\n{\"prompt\": \"2+2=\", \"answer\": \"4\"}\n";
  const std::string err = load_error(rows, DataConfig{}, eval::prompt_needs(reward_of("math")));
  EXPECT_NE(
      err.find(
          "train.jsonl:2: missing field 'label' (chosen by data.label_key; the math reward needs a label)"),
      std::string::npos)
      << err;
  EXPECT_NE(load_error(rows, DataConfig{}, eval::prompt_needs(reward_of("exact"))).find("data.label_key"),
            std::string::npos);
  // A null label is no label either.
  EXPECT_NE(load_error("{\"prompt\": \"a\", \"label\": null}\n", DataConfig{},
                       eval::prompt_needs(reward_of("math")))
                .find("train.jsonl:1: null field 'label'"),
            std::string::npos);
  // The key that chose the field is named, whatever it is set to.
  DataConfig answer;
  answer.label_key = "answer";
  EXPECT_NE(load_error(rows, answer, eval::prompt_needs(reward_of("math")))
                .find("train.jsonl:1: missing field 'answer' (chosen by data.label_key; the math reward "
                      "needs a label)"),
            std::string::npos);
}

TEST_F(Dataset, RewardsThatMayScoreWithoutALabelAcceptRowsWithout) {
  const std::string rows = "{\"prompt\": \"2+2=\", \"answer\": \"4\"}\n";
  EXPECT_EQ(load_error(rows, DataConfig{}, eval::prompt_needs(reward_of("remote"))), "");
  EXPECT_EQ(load_error(rows, DataConfig{}, PromptNeeds{}), "");
  // countdown reads its puzzle from the metadata when there is no label.
  const PromptNeeds countdown = eval::prompt_needs(reward_of("countdown"));
  EXPECT_EQ(load_error("{\"prompt\": \"p\", \"metadata\": {\"target\": 4, \"numbers\": [2, 2]}}\n",
                       DataConfig{}, countdown),
            "");
  EXPECT_NE(load_error(rows, DataConfig{}, countdown).find("the countdown reward needs a label"),
            std::string::npos);
}

TEST_F(Dataset, VerlRowsLoadAsTheyAre) {
  const json row = {{"data_source", "openai/gsm8k"},
                    {"prompt", json::array({{{"role", "user"}, {"content", "What is 2+2?"}}})},
                    {"ability", "math"},
                    {"reward_model", {{"style", "rule"}, {"ground_truth", "4"}}},
                    {"extra_info", {{"split", "train"}, {"index", 7}}}};
  DataConfig cfg;
  cfg.label_key = "reward_model.ground_truth";
  const std::string path = write("verl.jsonl", row.dump() + "\n");
  const auto ex = load_prompts(path, cfg, *tok_, eval::prompt_needs(reward_of("math")));
  ASSERT_EQ(ex.size(), 1u);
  EXPECT_EQ(ex[0].label, "4");
  // The message list went through the chat template as messages.
  EXPECT_EQ(ex[0].prompt_text, tok_->apply_chat_template({{"user", "What is 2+2?"}}, true));
  EXPECT_EQ(ex[0].prompt_ids, tok_->encode_chat({{"user", "What is 2+2?"}}, true));
  // data_source and extra_info reach compute_score as verl passes them.
  reward::RewardRequest req;
  req.response = "4";
  req.label = ex[0].label;
  req.metadata = ex[0].metadata;
  const json kw = reward::verl_kwargs(req);
  EXPECT_EQ(kw["data_source"], "openai/gsm8k");
  EXPECT_EQ(kw["ground_truth"], "4");
  EXPECT_EQ(kw["extra_info"], json({{"split", "train"}, {"index", 7}}));
}

TEST_F(Dataset, VerlRowsWithTheDefaultLabelKeySayWhichKeyToSet) {
  const json row = {{"prompt", "2+2="}, {"reward_model", {{"ground_truth", "4"}}}};
  const std::string err = load_error(row.dump() + "\n", DataConfig{}, eval::prompt_needs(reward_of("math")));
  EXPECT_NE(err.find("set data.label_key = \"reward_model.ground_truth\""), std::string::npos) << err;
}

TEST_F(Dataset, DataSourceAloneGivesExtraInfoNone) {
  const std::string path = write("ds.jsonl", "{\"prompt\": \"p\", \"data_source\": \"src\"}\n");
  const auto ex = load_prompts(path, DataConfig{}, *tok_);
  reward::RewardRequest req;
  req.metadata = ex[0].metadata;
  const json kw = reward::verl_kwargs(req);
  EXPECT_EQ(kw["data_source"], "src");
  EXPECT_TRUE(kw["extra_info"].is_null()) << kw.dump();
  // A row's own metadata keeps its meaning: extra_info, unless it holds one.
  const std::string p2 =
      write("meta.jsonl", "{\"prompt\": \"p\", \"data_source\": \"s\", \"metadata\": {\"k\": 1}}\n");
  const auto ex2 = load_prompts(p2, DataConfig{}, *tok_);
  EXPECT_EQ(ex2[0].metadata["k"], 1);
  EXPECT_EQ(ex2[0].metadata["data_source"], "s");
}

TEST_F(Dataset, DottedKeysReadNestedFieldsAndLiteralKeysWin) {
  const json row = {{"q", {{"text", "nested"}}}, {"q.text", "literal"}, {"m", {{"a", {{"b", 5}}}}}};
  EXPECT_EQ(*find_field(row, "q.text"), "literal");
  EXPECT_EQ(*find_field(row, "m.a.b"), 5);
  EXPECT_EQ(find_field(row, "m.a.c"), nullptr);
  EXPECT_EQ(find_field(row, "m.a.b.c"), nullptr);
  EXPECT_EQ(find_field(row, "m."), nullptr);
  DataConfig cfg;
  cfg.prompt_key = "question.text";
  cfg.metadata_key = "info.meta";
  cfg.apply_chat_template = false;
  const std::string path =
      write("nested.jsonl", "{\"question\": {\"text\": \"hello\"}, \"info\": {\"meta\": {\"id\": 3}}}\n");
  const auto ex = load_prompts(path, cfg, *tok_);
  EXPECT_EQ(ex[0].prompt_text, "hello");
  EXPECT_EQ(ex[0].metadata, json({{"id", 3}}));
}

TEST_F(Dataset, BadPromptsNameTheirKey) {
  EXPECT_NE(
      load_error("{\"text\": \"a\"}\n", DataConfig{}, {})
          .find("train.jsonl:1: missing field 'prompt' (chosen by data.prompt_key) or 'messages' (chosen by "
                "data.messages_key)"),
      std::string::npos);
  EXPECT_NE(load_error("{\"prompt\": 3}\n", DataConfig{}, {}).find("must be a string or a list of messages"),
            std::string::npos);
  EXPECT_NE(
      load_error("{\"prompt\": [{\"role\": \"user\"}]}\n", DataConfig{}, {})
          .find("each message of 'prompt' (chosen by data.prompt_key) needs string 'role' and 'content'"),
      std::string::npos);
}

TEST_F(Dataset, CheckPromptRowsNeedsNoTokenizer) {
  const std::string ok =
      write("ok.jsonl", "{\"prompt\": \"a\", \"label\": 1}\n\n{\"prompt\": \"b\", \"label\": 2}\n");
  EXPECT_EQ(check_prompt_rows(ok, DataConfig{}, eval::prompt_needs(reward_of("math"))), 2);
  const std::string bad = write("bad.jsonl", "{\"prompt\": \"a\", \"answer\": 1}\n");
  try {
    check_prompt_rows(bad, DataConfig{}, eval::prompt_needs(reward_of("math")));
    ADD_FAILURE() << "a row without its label passed";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("bad.jsonl:1: missing field 'label' (chosen by data.label_key"),
              std::string::npos)
        << e.what();
  }
}

TEST_F(Dataset, SftReadsMessageListPromptsAndNamesTheResponseKey) {
  const std::string path =
      write("sft.jsonl", "{\"prompt\": [{\"role\": \"user\", \"content\": \"hi\"}], \"response\": \"yo\"}\n");
  const auto ex = load_sft_examples(path, DataConfig{}, *tok_);
  ASSERT_EQ(ex.size(), 1u);
  EXPECT_EQ(ex[0].prompt_ids, tok_->encode_chat({{"user", "hi"}}, true));
  const std::string bad = write("sft_bad.jsonl", "{\"prompt\": \"hi\", \"answer\": \"yo\"}\n");
  try {
    load_sft_examples(bad, DataConfig{}, *tok_);
    ADD_FAILURE() << "a row without its response passed";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              bad + ":1: missing field 'response' (chosen by data.response_key; SFT trains on it)");
  }
}

}  // namespace
}  // namespace lockstep::data
