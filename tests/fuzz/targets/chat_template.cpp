// Fuzz target: the chat template detector (which built-in a tokenizer_config
// chat_template's Jinja source is) and the renderers, on messages made from
// the input. Input: Jinja source NUL then messages, each "role\x1fcontent"
// separated by '\x1e'; the first byte of the second part picks the options.
#include "lockstep/tokenizer/chat_template.h"

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_common.h"

using namespace lockstep;
using namespace lockstep::tokenizer;

namespace {

std::vector<ChatMessage> parse_messages(std::string_view s) {
  std::vector<ChatMessage> out;
  while (!s.empty() && out.size() < 32) {
    const size_t end = std::min(s.find('\x1e'), s.size());
    const std::string_view m = s.substr(0, end);
    const size_t sep = m.find('\x1f');
    if (sep == std::string_view::npos)
      out.push_back({"user", std::string(m)});
    else
      out.push_back({std::string(m.substr(0, sep)), std::string(m.substr(sep + 1))});
    s.remove_prefix(std::min(end + 1, s.size()));
  }
  return out;
}

void render_all(const ChatTemplate& t, const std::vector<ChatMessage>& messages) {
  for (const bool gen : {false, true})
    for (const char* bos : {"", "<s>"}) fuzz::run_expecting_error([&] { t.render(messages, gen, bos); });
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  const size_t nul = in.find('\0');
  const std::string jinja(in.substr(0, nul));
  std::string_view rest = nul == std::string_view::npos ? std::string_view() : in.substr(nul + 1);
  uint8_t options = 0;
  if (!rest.empty()) {
    options = uint8_t(rest[0]);
    rest.remove_prefix(1);
  }
  const std::vector<ChatMessage> messages = parse_messages(rest);

  std::optional<ChatTemplate> detected;
  fuzz::run_expecting_error([&] { detected = ChatTemplate::detect(jinja); });
  if (detected) render_all(*detected, messages);
  for (const std::string& name : builtin_chat_template_names()) {
    ChatTemplate t = ChatTemplate::by_name(name);
    if (options & 1) t.default_system = jinja.substr(0, 64);
    if (options & 2) t.llama_date = "26 Jul 2024";
    if (options & 4) t.deepseek_think = true;
    render_all(t, messages);
  }
  fuzz::run_expecting_error([&] { ChatTemplate::by_name(jinja); });
  return 0;
}
