// Chat formatting with built-in templates (chatml, llama3, deepseek, raw)
// instead of a Jinja engine: the Jinja text of tokenizer_config.json is only
// inspected to recognise which built-in it is (and a few of its options).
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace lockstep::tokenizer {

struct ChatMessage {
  std::string role;  // "system", "user", "assistant", ...
  std::string content;
};

enum class ChatFormat { ChatML, Llama3, DeepSeek, Raw };

class ChatTemplate {
 public:
  // One of builtin_chat_template_names(); throws Error listing them otherwise.
  static ChatTemplate by_name(const std::string& name);
  // The built-in that the Jinja source implements, with the options it shows
  // (a default system prompt, a Llama 3.1 date header, DeepSeek-R1's <think>);
  // nullopt when it is none of them.
  static std::optional<ChatTemplate> detect(const std::string& jinja);

  // The prompt text for `messages`. `bos_token` is the text templates that start
  // with BOS put first (llama3, deepseek); empty for none.
  std::string render(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                     const std::string& bos_token) const;

  ChatFormat format() const { return format_; }
  const std::string& name() const { return name_; }

  // chatml: system prompt inserted when the conversation does not start with one (Qwen2/2.5).
  std::string default_system;
  // llama3: when set, the Llama 3.1+ system header "Cutting Knowledge Date: December 2023\n
  // Today Date: <date>" is always written (the templates' default date, never today's).
  std::string llama_date;
  // deepseek: the generation prompt opens a reasoning block (DeepSeek-R1), and
  // earlier assistant turns keep only the text after their last </think>.
  bool deepseek_think = false;

 private:
  ChatTemplate(ChatFormat f, std::string name) : format_(f), name_(std::move(name)) {}
  ChatFormat format_;
  std::string name_;
};

std::vector<std::string> builtin_chat_template_names();
// Jinja source of plain ChatML (what write_byte_level_tokenizer stores); detect()
// recognises it as chatml without a default system prompt.
const std::string& chatml_jinja_template();

}  // namespace lockstep::tokenizer
