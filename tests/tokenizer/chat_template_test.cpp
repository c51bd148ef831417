// Tests of the built-in chat templates and of recognising them in the Jinja
// text of real tokenizer_config.json files (excerpts of the Qwen2.5, Qwen3,
// Llama 3, Llama 3.1 and DeepSeek-V3/R1 templates).
#include "lockstep/tokenizer/chat_template.h"

#include <gtest/gtest.h>

#include "fixtures.h"
#include "lockstep/base/error.h"
#include "lockstep/tokenizer/unicode.h"

namespace lockstep::tokenizer {
namespace {

const std::vector<ChatMessage> kChat = {{"system", "Be brief."}, {"user", "Hi!"}, {"assistant", "Hello."}, {"user", "2+2?"}};
const std::string kDsUser = "<\xEF\xBD\x9CUser\xEF\xBD\x9C>";
const std::string kDsAssistant = "<\xEF\xBD\x9C" "Assistant\xEF\xBD\x9C>";
const std::string kDsEos = "<\xEF\xBD\x9C" "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>";

// Excerpts: the parts of the real templates that detection looks at (escapes as in the files).
const char* kQwen25 =
    "{%- if messages[0]['role'] == 'system' %}\n        {{- '<|im_start|>system\\n' + messages[0]['content'] + "
    "'<|im_end|>\\n' }}\n    {%- else %}\n        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. "
    "You are a helpful assistant.<|im_end|>\\n' }}\n    {%- endif %}";
const char* kQwen3 =
    "{%- if messages[0].role == 'system' %}\n        {{- '<|im_start|>system\\n' + messages[0].content + "
    "'<|im_end|>\\n' }}\n    {%- endif %}{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' "
    "+ '\\n' }}";
const char* kLlama3 =
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + "
    "message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 "
    "%}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ "
    "'<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}";
const char* kLlama31 =
    "{%- if not date_string is defined %}\n    {%- set date_string = \"26 Jul 2024\" %}\n{%- endif %}\n"
    "{{- \"<|start_header_id|>system<|end_header_id|>\\n\\n\" }}{{- \"Cutting Knowledge Date: December 2023\\n\" }}";

TEST(ChatTemplate, DetectsRealTemplates) {
  auto q25 = ChatTemplate::detect(kQwen25);
  ASSERT_TRUE(q25);
  EXPECT_EQ(q25->name(), "chatml");
  EXPECT_EQ(q25->default_system, "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.");
  auto q3 = ChatTemplate::detect(kQwen3);
  ASSERT_TRUE(q3);
  EXPECT_EQ(q3->default_system, "");
  auto l3 = ChatTemplate::detect(kLlama3);
  ASSERT_TRUE(l3);
  EXPECT_EQ(l3->name(), "llama3");
  EXPECT_EQ(l3->llama_date, "");
  auto l31 = ChatTemplate::detect(kLlama31);
  ASSERT_TRUE(l31);
  EXPECT_EQ(l31->llama_date, "26 Jul 2024");
  auto ds = ChatTemplate::detect("{{bos_token}}{{ns.system_prompt}}{{'" + kDsUser + "' + message['content']}}");
  ASSERT_TRUE(ds);
  EXPECT_EQ(ds->name(), "deepseek");
  EXPECT_FALSE(ds->deepseek_think);
  auto r1 = ChatTemplate::detect("{{'" + kDsUser + "'}}{% if add_generation_prompt %}{{'" + kDsAssistant + "<think>\\n'}}");
  ASSERT_TRUE(r1);
  EXPECT_TRUE(r1->deepseek_think);
  EXPECT_FALSE(ChatTemplate::detect("{% for m in messages %}[INST] {{ m.content }} [/INST]{% endfor %}"));
  EXPECT_EQ(ChatTemplate::detect(chatml_jinja_template())->name(), "chatml");
}

TEST(ChatTemplate, RendersChatml) {
  ChatTemplate t = ChatTemplate::by_name("chatml");
  EXPECT_EQ(t.render(kChat, true, ""),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n"
            "Hello.<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n");
  auto q25 = *ChatTemplate::detect(kQwen25);
  EXPECT_EQ(q25.render({{"user", "Hi"}}, false, ""),
            "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
            "<|im_start|>user\nHi<|im_end|>\n");
}

TEST(ChatTemplate, RendersLlama3) {
  ChatTemplate t = ChatTemplate::by_name("llama3");
  EXPECT_EQ(t.render({{"system", " Be brief. "}, {"user", "Hi!\n"}}, true, "<|begin_of_text|>"),
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nHi!<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n");
  auto l31 = *ChatTemplate::detect(kLlama31);
  EXPECT_EQ(l31.render({{"user", "Hi"}}, false, "<|begin_of_text|>"),
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\n"
            "Today Date: 26 Jul 2024\n\n<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>");
}

TEST(ChatTemplate, RendersDeepSeek) {
  ChatTemplate t = ChatTemplate::by_name("deepseek");
  const std::string bos = "<\xEF\xBD\x9C" "begin\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>";
  EXPECT_EQ(t.render(kChat, true, bos),
            bos + "Be brief." + kDsUser + "Hi!" + kDsAssistant + "Hello." + kDsEos + kDsUser + "2+2?" + kDsAssistant);
  ChatTemplate r1 = t;
  r1.deepseek_think = true;
  EXPECT_EQ(r1.render({{"user", "q"}, {"assistant", "<think>\nhm\n</think>\n\nA"}, {"user", "r"}}, true, bos),
            bos + kDsUser + "q" + kDsAssistant + "\n\nA" + kDsEos + kDsUser + "r" + kDsAssistant + "<think>\n");
  EXPECT_THROW(t.render({{"tool", "x"}}, false, bos), Error);
}

TEST(ChatTemplate, RawJoinsContents) {
  EXPECT_EQ(ChatTemplate::by_name("raw").render({{"system", "a"}, {"user", "b"}}, true, "<s>"), "a\nb");
}

// Found by tests/fuzz/targets/chat_template.cpp (ASan: SEGV in PCRE2's JIT
// code): detection ran the regex on bytes that are not UTF-8, which PCRE2
// matches unchecked; chat_template.jinja is a file and may hold any bytes.
TEST(ChatTemplate, DetectionOfBytesThatAreNotUtf8) {
  const std::string jinja =
      "{%- if not date_string is defined %}{%- set date_string = \"" + std::string(20, '\xc7') +
      "26 Jul 2024\xfe\xff\" %}{%- endif %}{{- \"<|start_header_id|>system<|end_header_id|>\" }}"
      "{{- \"Cutting Knowledge Date: December 2023\\n\" }}";
  const auto t = ChatTemplate::detect(jinja);
  ASSERT_TRUE(t.has_value());
  EXPECT_EQ(t->name(), "llama3");
  EXPECT_TRUE(utf8_is_valid(t->llama_date)) << t->llama_date;
  EXPECT_NE(t->llama_date.find("26 Jul 2024"), std::string::npos) << t->llama_date;
}

TEST(ChatTemplate, UnknownTemplatesGiveClearErrors) {
  try {
    ChatTemplate::by_name("vicuna");
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("chatml, llama3, deepseek, raw"), std::string::npos);
  }
  // Found by tests/fuzz/targets/chat_template.cpp: the name (a whole Jinja
  // source, bytes and all) was quoted as it was.
  try {
    ChatTemplate::by_name("{{\x06" + std::string(10000, 'x'));
    ADD_FAILURE();
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("unknown chat template '{{\\x06xxx"), std::string::npos) << msg;
    EXPECT_LT(msg.size(), 200u) << msg;
  }
  try {
    ChatTemplate::by_name("deepseek").render({{"s}ystem\x01", "x"}}, false, "");
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("role 's}ystem\\x01' is not supported"), std::string::npos)
        << e.what();
  }
  test::TempDir dir;
  test::BpeFixture f;
  dir.write("tokenizer.json", f.json());
  dir.write("tokenizer_config.json", R"({"chat_template": "{% for m in messages %}[INST] {{ m.content }}{% endfor %}"})");
  Tokenizer t = Tokenizer::load(dir.path());
  try {
    t.apply_chat_template({{"user", "x"}});
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("chat_template is not one of the built-in templates"), std::string::npos)
        << e.what();
  }
  // Choosing one explicitly works, and so does choosing for a tokenizer without any template.
  TokenizerOptions opts;
  opts.chat_template = "raw";
  EXPECT_EQ(Tokenizer::load(dir.path(), opts).apply_chat_template({{"user", "x"}}), "x");
  Tokenizer bare = f.load();
  EXPECT_THROW(bare.chat_template(), Error);
  opts.chat_template = "nonsense";
  EXPECT_THROW(Tokenizer::load(dir.path(), opts), Error);
}

}  // namespace
}  // namespace lockstep::tokenizer
