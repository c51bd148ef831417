// The built-in chat templates and the recognition of Jinja chat templates.
#include "lockstep/tokenizer/chat_template.h"

#include "lockstep/base/error.h"
#include "lockstep/base/excerpt.h"
#include "lockstep/tokenizer/regex.h"
#include "lockstep/tokenizer/unicode.h"

namespace lockstep::tokenizer {
namespace {

// DeepSeek's markers use fullwidth bars (U+FF5C) and '▁' (U+2581).
const std::string kDsUser = "<\xEF\xBD\x9CUser\xEF\xBD\x9C>";
const std::string kDsAssistant = "<\xEF\xBD\x9C" "Assistant\xEF\xBD\x9C>";
const std::string kDsEos = "<\xEF\xBD\x9C" "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>";

// Jinja's `trim` (Python str.strip): whitespace at both ends.
std::string trim(const std::string& s) {
  auto ws = [](uint32_t cp) { return is_white_space(cp) || (cp >= 0x1C && cp <= 0x1F); };
  size_t b = 0, e = s.size();
  while (b < e) {
    Utf8Step st = utf8_next(s, b);
    if (!ws(st.cp)) break;
    b += st.len;
  }
  while (e > b) {
    size_t k = e - 1;
    while (k > b && (static_cast<unsigned char>(s[k]) & 0xC0) == 0x80) --k;
    if (!ws(utf8_next(s, k).cp)) break;
    e = k;
  }
  return s.substr(b, e - b);
}

// Undoes the escapes of a Jinja string literal that matter here.
std::string unescape_jinja(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && i + 1 < s.size()) {
      char c = s[++i];
      out.push_back(c == 'n' ? '\n' : c == 't' ? '\t' : c);
    } else {
      out.push_back(s[i]);
    }
  }
  return out;
}

// First capture group of `pattern` in `jinja`, if it matches.
std::optional<std::string> capture(const std::string& pattern, const std::string& jinja) {
  // Regex needs valid UTF-8 (PCRE2 matches without checking it, and its JIT
  // code reads past the subject on a broken sequence); chat_template.jinja is
  // a file and may hold any bytes.
  const std::string text = utf8_is_valid(jinja) ? jinja : utf8_sanitize(jinja);
  // Regex only reports whole matches, so find the match and strip the fixed parts.
  Regex re(pattern, "chat template detection");
  std::vector<Span> spans;
  re.find_all(text, spans);
  if (spans.empty()) return std::nullopt;
  return text.substr(spans[0].begin, spans[0].end - spans[0].begin);
}

}  // namespace

std::vector<std::string> builtin_chat_template_names() { return {"chatml", "llama3", "deepseek", "raw"}; }

const std::string& chatml_jinja_template() {
  static const std::string t =
      "{%- for message in messages %}"
      "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
      "{%- endfor %}"
      "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}";
  return t;
}

ChatTemplate ChatTemplate::by_name(const std::string& name) {
  if (name == "chatml") return ChatTemplate(ChatFormat::ChatML, name);
  if (name == "llama3") return ChatTemplate(ChatFormat::Llama3, name);
  if (name == "deepseek") return ChatTemplate(ChatFormat::DeepSeek, name);
  if (name == "raw") return ChatTemplate(ChatFormat::Raw, name);
  LS_THROW << "unknown chat template '" << excerpt(name)
           << "' (built-in templates: chatml, llama3, deepseek, raw)";
}

std::optional<ChatTemplate> ChatTemplate::detect(const std::string& jinja) {
  if (jinja.find("<|im_start|>") != std::string::npos) {
    ChatTemplate t(ChatFormat::ChatML, "chatml");
    // Qwen2/2.5 write '<|im_start|>system\nYou are ...<|im_end|>\n' as one literal
    // when the conversation has no system message.
    if (auto m = capture(R"(<\|im_start\|>system\\n[^'"{}+]*<\|im_end\|>)", jinja)) {
      const std::string head = "<|im_start|>system\\n", tail = "<|im_end|>";
      t.default_system = unescape_jinja(m->substr(head.size(), m->size() - head.size() - tail.size()));
    }
    return t;
  }
  if (jinja.find("<|start_header_id|>") != std::string::npos) {
    ChatTemplate t(ChatFormat::Llama3, "llama3");
    if (jinja.find("Cutting Knowledge Date") != std::string::npos) {
      t.llama_date = "26 Jul 2024";
      if (auto m = capture(R"(date_string\s*=\s*"[^"]*")", jinja)) {
        size_t q = m->find('"');
        t.llama_date = m->substr(q + 1, m->size() - q - 2);
      }
    }
    return t;
  }
  if (jinja.find(kDsAssistant) != std::string::npos || jinja.find(kDsUser) != std::string::npos) {
    ChatTemplate t(ChatFormat::DeepSeek, "deepseek");
    t.deepseek_think = jinja.find(kDsAssistant + "<think>") != std::string::npos;
    return t;
  }
  return std::nullopt;
}

std::string ChatTemplate::render(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                                 const std::string& bos_token) const {
  std::string out;
  switch (format_) {
    case ChatFormat::ChatML: {
      if (!default_system.empty() && (messages.empty() || messages[0].role != "system")) {
        out += "<|im_start|>system\n" + default_system + "<|im_end|>\n";
      }
      for (const auto& m : messages) out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
      if (add_generation_prompt) out += "<|im_start|>assistant\n";
      return out;
    }
    case ChatFormat::Llama3: {
      out += bos_token;
      size_t first = 0;
      if (!llama_date.empty()) {
        std::string system;
        if (!messages.empty() && messages[0].role == "system") {
          system = trim(messages[0].content);
          first = 1;
        }
        out += "<|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\nToday Date: " +
               llama_date + "\n\n" + system + "<|eot_id|>";
      }
      for (size_t i = first; i < messages.size(); ++i) {
        out += "<|start_header_id|>" + messages[i].role + "<|end_header_id|>\n\n" + trim(messages[i].content) +
               "<|eot_id|>";
      }
      if (add_generation_prompt) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
      return out;
    }
    case ChatFormat::DeepSeek: {
      std::string system;
      for (const auto& m : messages) {
        if (m.role != "system") continue;
        if (!system.empty()) system += "\n\n";
        system += m.content;
      }
      out += bos_token + system;
      for (const auto& m : messages) {
        if (m.role == "system") continue;
        if (m.role == "user") {
          out += kDsUser + m.content;
        } else if (m.role == "assistant") {
          std::string content = m.content;
          if (deepseek_think) {
            size_t at = content.rfind("</think>");
            if (at != std::string::npos) content = content.substr(at + 8);
          }
          out += kDsAssistant + content + kDsEos;
        } else {
          LS_THROW << "chat template deepseek: role '" << excerpt(m.role)
                   << "' is not supported (system, user and assistant are)";
        }
      }
      if (add_generation_prompt) out += kDsAssistant + (deepseek_think ? "<think>\n" : "");
      return out;
    }
    case ChatFormat::Raw: {
      for (size_t i = 0; i < messages.size(); ++i) {
        if (i > 0) out += "\n";
        out += messages[i].content;
      }
      return out;
    }
  }
  return out;
}

}  // namespace lockstep::tokenizer
