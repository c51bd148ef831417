// PEFT's adapter_config.json: lockstep's file round trip, the keys and values
// PEFT writes, a config as PEFT itself writes one (every LoraConfig key), and
// each refusal with the file and key in its message.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "lockstep/base/file_util.h"
#include "lockstep/model/peft.h"
#include "model/model_test_util.h"

namespace lockstep {
namespace {

using json = nlohmann::json;
using test::expect_error;
using test::TempDir;

// What PEFT 0.17's LoraConfig.save_pretrained writes for
// LoraConfig(r=16, lora_alpha=32, lora_dropout=0.05, target_modules=["q_proj", "v_proj", "down_proj"],
// task_type="CAUSAL_LM"): every key, the target set in set order.
const char* const kPeftWritten = R"({
  "alora_invocation_tokens": null,
  "alpha_pattern": {},
  "arrow_config": null,
  "auto_mapping": null,
  "base_model_name_or_path": "Qwen/Qwen3-0.6B",
  "bias": "none",
  "corda_config": null,
  "ensure_weight_tying": false,
  "eva_config": null,
  "exclude_modules": null,
  "fan_in_fan_out": false,
  "inference_mode": true,
  "init_lora_weights": true,
  "layer_replication": null,
  "layers_pattern": null,
  "layers_to_transform": null,
  "loftq_config": {},
  "lora_alpha": 32,
  "lora_bias": false,
  "lora_dropout": 0.05,
  "megatron_config": null,
  "megatron_core": "megatron.core",
  "modules_to_save": null,
  "peft_type": "LORA",
  "peft_version": "0.17.1",
  "qalora_group_size": 16,
  "r": 16,
  "rank_pattern": {},
  "revision": null,
  "target_modules": ["v_proj", "down_proj", "q_proj"],
  "target_parameters": null,
  "task_type": "CAUSAL_LM",
  "trainable_token_indices": null,
  "use_dora": false,
  "use_qalora": false,
  "use_rslora": false
})";

TEST(AdapterConfig, FileRoundTrip) {
  TempDir dir("peft-config");
  LoraSpec s;
  s.rank = 4;
  s.alpha = 8.5;
  s.dropout = 0.125;
  s.target_modules = {"k_proj", "o_proj", "up_proj"};
  s.base_model_name_or_path = "Qwen/Qwen3-0.6B";
  write_adapter_config(dir.str(), s);
  const LoraSpec r = read_adapter_config(dir.str());
  EXPECT_EQ(r.rank, 4);
  EXPECT_EQ(r.alpha, 8.5);
  EXPECT_EQ(r.dropout, 0.125);
  EXPECT_EQ(r.target_modules, s.target_modules);
  EXPECT_EQ(r.base_model_name_or_path, "Qwen/Qwen3-0.6B");
  EXPECT_EQ(r.scale(), 8.5 / 4);
}

TEST(AdapterConfig, WritesPeftKeys) {
  LoraSpec s;
  s.rank = 8;
  s.alpha = 16;
  const json j = json::parse(adapter_config_json(s));
  EXPECT_EQ(j.at("peft_type"), "LORA");
  EXPECT_EQ(j.at("task_type"), "CAUSAL_LM");
  EXPECT_EQ(j.at("r"), 8);
  EXPECT_TRUE(j.at("lora_alpha").is_number_integer());  // as PEFT writes an integral alpha
  EXPECT_EQ(j.at("lora_alpha"), 16);
  EXPECT_EQ(j.at("lora_dropout"), 0.0);
  EXPECT_EQ(j.at("target_modules"), json({"q_proj", "k_proj", "v_proj", "o_proj"}));
  EXPECT_EQ(j.at("bias"), "none");
  EXPECT_TRUE(j.at("base_model_name_or_path").is_null());
  EXPECT_EQ(j.at("fan_in_fan_out"), false);
  EXPECT_EQ(j.at("use_rslora"), false);
  EXPECT_EQ(j.at("use_dora"), false);
  EXPECT_TRUE(j.at("modules_to_save").is_null());
  EXPECT_EQ(j.at("inference_mode"), true);
  s.alpha = 2.5;
  EXPECT_EQ(json::parse(adapter_config_json(s)).at("lora_alpha"), 2.5);
}

TEST(AdapterConfig, ReadsWhatPeftWrites) {
  const LoraSpec s = parse_adapter_config(kPeftWritten, "peft/adapter_config.json");
  EXPECT_EQ(s.rank, 16);
  EXPECT_EQ(s.alpha, 32.0);
  EXPECT_EQ(s.dropout, 0.05);
  EXPECT_EQ(s.target_modules,
            (std::vector<std::string>{"q_proj", "v_proj", "down_proj"}));  // canonical order
  EXPECT_EQ(s.base_model_name_or_path, "Qwen/Qwen3-0.6B");
  EXPECT_EQ(s.scale(), 2.0);
}

TEST(AdapterConfig, AllLinearIsTheSevenProjections) {
  json j = json::parse(kPeftWritten);
  j["target_modules"] = "all-linear";
  EXPECT_EQ(parse_adapter_config(j.dump(), "a.json").target_modules, lora_module_names());
  EXPECT_EQ(lora_module_names().size(), 7u);
  // lockstep writes the list, so PEFT adapts exactly what lockstep did (its
  // "all-linear" would also take an MoE router).
  LoraSpec s;
  s.target_modules = lora_module_names();
  EXPECT_TRUE(json::parse(adapter_config_json(s)).at("target_modules").is_array());
}

// Each change to PEFT's file that lockstep cannot honour, the key the error must name.
TEST(AdapterConfig, RefusesWhatLockstepCannotHonour) {
  struct Case {
    const char* key;
    json value;
    const char* says;
  };
  const Case cases[] = {
      {"use_rslora", true, "only false"},
      {"use_dora", true, "only false"},
      {"fan_in_fan_out", true, "only false"},
      {"lora_bias", true, "only false"},
      {"bias", "lora_only", "\"none\" only"},
      {"modules_to_save", json::array({"lm_head"}), "only null or empty"},
      {"rank_pattern", json({{"q_proj", 4}}), "only null or empty"},
      {"alpha_pattern", json({{"q_proj", 4}}), "only null or empty"},
      {"layers_to_transform", json::array({0}), "only null or empty"},
      {"exclude_modules", json::array({"v_proj"}), "only null or empty"},
      {"peft_type", "PREFIX_TUNING", "LoRA adapters"},
      {"task_type", "SEQ_CLS", "causal language models"},
      {"target_modules", json::array({"q_proj", "lm_head"}), "cannot adapt module \"lm_head\""},
      {"target_modules", json::array({"embed_tokens"}), "cannot adapt module"},
      {"target_modules", json::array({"q_proj", 3}), "module names are strings"},
      {"target_modules", ".*proj", "pattern"},
      {"target_modules", json::array(), "non-empty list"},
      {"r", 0, "r must be >= 1"},
      {"r", "8", "positive integer"},
      {"r", 8.5, "positive integer"},
      {"lora_alpha", "16", "a number"},
      {"lora_dropout", 1.0, "lora_dropout must be in [0, 1)"},
      {"no_such_key", 1, "unknown key \"no_such_key\" = 1"},
      {"use_some_new_variant", true, "unknown key \"use_some_new_variant\" = true"},
  };
  for (const Case& c : cases) {
    json j = json::parse(kPeftWritten);
    j[c.key] = c.value;
    SCOPED_TRACE(std::string(c.key) + " = " + c.value.dump());
    expect_error([&] { parse_adapter_config(j.dump(), "dir/adapter_config.json"); },
                 {"dir/adapter_config.json: ", c.key, c.says});
  }
  // A key lockstep does not know, at a value that leaves its feature off,
  // is read (a newer PEFT writes such keys); set, it is refused (above).
  for (const json& off : {json(nullptr), json(false), json::array(), json::object()}) {
    json j = json::parse(kPeftWritten);
    j["use_some_new_variant"] = off;
    EXPECT_EQ(parse_adapter_config(j.dump(), "a.json").rank, 16) << off.dump();
  }
  for (const char* key : {"r", "lora_alpha", "peft_type", "target_modules"}) {
    json j = json::parse(kPeftWritten);
    j.erase(key);
    expect_error([&] { parse_adapter_config(j.dump(), "a.json"); }, {"a.json: missing key \"", key});
  }
}

TEST(AdapterConfig, BadFiles) {
  TempDir dir("peft-config-bad");
  expect_error([&] { read_adapter_config(dir.str()); }, {dir.str("adapter_config.json")});
  write_file_atomic(dir.str("adapter_config.json"), "{\"r\": 8,");
  expect_error([&] { read_adapter_config(dir.str()); }, {dir.str("adapter_config.json"), "not valid JSON"});
  write_file_atomic(dir.str("adapter_config.json"), "[1, 2]");
  expect_error([&] { read_adapter_config(dir.str()); }, {"expected a JSON object"});
}

TEST(AdapterConfig, ErrorsQuoteLongValuesShortly) {
  const size_t n = test::expect_short_errors_for_long_strings(
      json::parse(kPeftWritten), [](const json& j) { parse_adapter_config(j.dump(), "a.json"); });
  EXPECT_GE(n, 30u);
  json j = json::parse(kPeftWritten);
  j[std::string(6000, 'k')] = 1;  // an unknown key quoted in the message
  expect_error([&] { parse_adapter_config(j.dump(), "a.json"); }, {"unknown key"});
  try {
    parse_adapter_config(j.dump(), "a.json");
  } catch (const Error& e) {
    EXPECT_LT(std::string(e.what()).size(), 512u);
  }
}

TEST(LoraSpec, TargetModulesFromAnyList) {
  EXPECT_EQ(lora_target_modules({"down_proj", "q_proj", "down_proj"}),
            (std::vector<std::string>{"q_proj", "down_proj"}));
  EXPECT_EQ(lora_target_modules({"q_proj", "all-linear"}), lora_module_names());
  expect_error([] { lora_target_modules({}); }, {"target_modules is empty"});
  expect_error([] { lora_target_modules({"q_proj", "mlp.gate"}); }, {"cannot adapt module \"mlp.gate\""});
  LoraSpec s;
  s.target_modules = lora_target_modules({"v_proj", "k_proj"});
  s.validate();
}

TEST(LoraSpec, Validate) {
  LoraSpec s;
  s.validate();
  s.target_modules = {"v_proj", "q_proj"};
  expect_error([&] { s.validate(); }, {"target_modules", "once, in the order"});
  s.target_modules = {"q_proj", "q_proj"};
  expect_error([&] { s.validate(); }, {"target_modules"});
  s.target_modules = {"gate"};
  expect_error([&] { s.validate(); }, {"cannot adapt module \"gate\""});
  s.target_modules = {};
  expect_error([&] { s.validate(); }, {"target_modules is empty"});
  s = LoraSpec{};
  s.alpha = 0;
  expect_error([&] { s.validate(); }, {"lora_alpha"});
  s = LoraSpec{};
  s.dropout = -0.1;
  expect_error([&] { s.validate(); }, {"lora_dropout"});
}

}  // namespace
}  // namespace lockstep
