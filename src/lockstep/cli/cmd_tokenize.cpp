// `lockstep tokenize`: encode or decode with a Hugging Face tokenizer from the
// command line, for debugging, and encode a JSONL file's texts in batch.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "lockstep/base/error.h"
#include "lockstep/base/excerpt.h"
#include "lockstep/base/thread_pool.h"
#include "lockstep/cli/command.h"
#include "lockstep/tokenizer/tokenizer.h"

namespace lockstep::cli {
namespace {

using OJson = nlohmann::ordered_json;
using tokenizer::ChatMessage;
using tokenizer::Tokenizer;

// Lines encoded per parallel batch: large enough to keep the threads busy,
// small enough that a huge file never sits in memory at once.
constexpr size_t kBatchLines = 4096;

std::vector<int32_t> parse_ids(const std::string& text) {
  std::vector<int32_t> ids;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    size_t b = item.find_first_not_of(" \t[]");
    size_t e = item.find_last_not_of(" \t[]");
    if (b == std::string::npos) continue;
    item = item.substr(b, e - b + 1);
    try {
      size_t used = 0;
      long long v = std::stoll(item, &used);
      if (used != item.size() || v < 0 || v > INT32_MAX) throw std::invalid_argument("range");
      ids.push_back(static_cast<int32_t>(v));
    } catch (const std::exception&) {
      LS_THROW << "--ids: '" << item << "' is not a token id (expected e.g. --ids 1,2,3)";
    }
  }
  return ids;
}

// Token strings are shown JSON-escaped so spaces, newlines and bytes are visible.
std::string show(const std::string& s) { return OJson(s).dump(-1, ' ', false, OJson::error_handler_t::replace); }

int encode_text(const Tokenizer& tok, const std::string& text, bool add_special) {
  std::vector<int32_t> ids = tok.encode(text, add_special);
  std::cout << "ids (" << ids.size() << "): " << OJson(ids).dump() << "\n";
  for (int32_t id : ids) {
    std::cout << "  " << id << "\t" << show(tok.id_to_token(id).value_or("")) << (tok.is_special(id) ? "  (special)" : "")
              << "\n";
  }
  return 0;
}

int decode_ids(const Tokenizer& tok, const std::string& list, bool skip_special) {
  std::vector<int32_t> ids = parse_ids(list);
  for (int32_t id : ids) {
    if (id >= tok.vocab_size() || !tok.id_to_token(id)) {
      LS_THROW << "--ids: " << id << " is not a token of this tokenizer (vocab size " << tok.vocab_size() << ")";
    }
  }
  std::cout << tok.decode(ids, skip_special) << "\n";
  return 0;
}

// The ids of one JSONL record: its "text", or its "messages" rendered with the chat template.
std::vector<int32_t> encode_record(const Tokenizer& tok, const OJson& rec, bool add_special, const std::string& where) {
  if (!rec.is_object()) LS_THROW << where << ": expected a JSON object";
  auto it = rec.find("text");
  if (it != rec.end()) {
    if (!it->is_string()) LS_THROW << where << ": \"text\" must be a string";
    return tok.encode(it->get<std::string>(), add_special);
  }
  auto m = rec.find("messages");
  if (m == rec.end()) LS_THROW << where << ": needs a \"text\" string (or a \"messages\" list)";
  if (!m->is_array()) LS_THROW << where << ": \"messages\" must be a list of {role, content}";
  std::vector<ChatMessage> chat;
  for (const auto& msg : *m) {
    if (!msg.is_object() || !msg.contains("role") || !msg.contains("content") || !msg["role"].is_string() ||
        !msg["content"].is_string())
      LS_THROW << where << ": each message needs string \"role\" and \"content\"";
    chat.push_back({msg["role"].get<std::string>(), msg["content"].get<std::string>()});
  }
  // A conversation that does not end with the assistant is a prompt awaiting its answer.
  bool prompt = chat.empty() || chat.back().role != "assistant";
  return tok.encode_chat(chat, prompt);
}

int encode_file(const Tokenizer& tok, const std::string& input, const std::string& output, bool add_special) {
  std::ifstream in(input, std::ios::binary);
  if (!in) LS_THROW << input << ": cannot open";
  // Written to a temporary name and renamed at the end: a failed run never
  // leaves a half-written file under the output name.
  std::string tmp = output + ".tmp";
  std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
  if (!out) LS_THROW << tmp << ": cannot open for writing";
  ThreadPool pool(default_thread_count());
  std::vector<std::string> lines;
  std::vector<size_t> line_numbers;
  std::vector<std::string> results;
  size_t line_no = 0, records = 0;
  auto flush_batch = [&]() {
    results.assign(lines.size(), std::string());
    pool.parallel_for(static_cast<int64_t>(lines.size()), [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        auto k = static_cast<size_t>(i);
        std::string where = input + ":" + std::to_string(line_numbers[k]);
        OJson rec;
        try {
          rec = OJson::parse(lines[k]);
        } catch (const OJson::exception& err) {  // parse_error, or out_of_range for 1e400
          LS_THROW << where << ": invalid JSON: " << excerpt(err.what(), kJsonErrorBytes);
        }
        rec["ids"] = encode_record(tok, rec, add_special, where);
        results[k] = rec.dump(-1, ' ', false, OJson::error_handler_t::replace);
      }
    });
    for (auto& r : results) out << r << '\n';
    records += lines.size();
    lines.clear();
    line_numbers.clear();
  };
  try {
    std::string line;
    while (std::getline(in, line)) {
      ++line_no;
      if (!line.empty() && line.back() == '\r') line.pop_back();
      if (line.find_first_not_of(" \t") == std::string::npos) continue;  // blank lines are skipped
      lines.push_back(std::move(line));
      line_numbers.push_back(line_no);
      if (lines.size() == kBatchLines) flush_batch();
    }
    if (!lines.empty()) flush_batch();
    out.close();
    if (!out) LS_THROW << tmp << ": write failed";
    std::filesystem::rename(tmp, output);
  } catch (...) {
    out.close();
    std::error_code ec;
    std::filesystem::remove(tmp, ec);
    throw;
  }
  std::cerr << "tokenize: wrote " << records << " records to " << output << "\n";
  return 0;
}

int run_tokenize(const Args& args) {
  args.check_known({"tokenizer", "text", "ids", "input", "output", "add-special-tokens", "skip-special-tokens",
                    "chat-template"});
  tokenizer::TokenizerOptions opts;
  opts.chat_template = args.get("chat-template", "auto");
  Tokenizer tok = Tokenizer::load(args.require("tokenizer"), opts);
  bool add_special = args.flag("add-special-tokens");
  int modes = int(args.has("text")) + int(args.has("ids")) + int(args.has("input"));
  if (modes != 1) LS_THROW << "give exactly one of --text, --ids or --input (see --help)";
  if (args.has("text")) return encode_text(tok, args.require("text"), add_special);
  if (args.has("ids")) return decode_ids(tok, args.require("ids"), args.flag("skip-special-tokens"));
  return encode_file(tok, args.require("input"), args.require("output"), add_special);
}

LS_REGISTER_COMMAND(Command{
    "tokenize", "encode/decode text with a Hugging Face tokenizer (debugging, JSONL batches)",
    "usage: lockstep tokenize --tokenizer DIR --text TEXT [--add-special-tokens]\n"
    "       lockstep tokenize --tokenizer DIR --ids 1,2,3 [--skip-special-tokens]\n"
    "       lockstep tokenize --tokenizer DIR --input IN.jsonl --output OUT.jsonl [--add-special-tokens]\n"
    "\n"
    "DIR holds tokenizer.json (and optionally tokenizer_config.json); a path to a\n"
    "tokenizer.json file works too.\n"
    "\n"
    "  --text TEXT             print the ids of TEXT and the token behind each id\n"
    "  --ids LIST              print the text of comma-separated ids\n"
    "  --input IN.jsonl        encode each line's \"text\" (or its chat \"messages\") and\n"
    "  --output OUT.jsonl      write the line back with an \"ids\" field added\n"
    "  --add-special-tokens    add the tokenizer's BOS/EOS (post-processor); off by default\n"
    "  --skip-special-tokens   leave special tokens out when decoding --ids\n"
    "  --chat-template NAME    chatml, llama3, deepseek or raw for \"messages\" records\n"
    "                          (default: recognised from tokenizer_config.json)\n"
    "\n"
    "Special tokens written in the text (e.g. <|im_end|>) are recognised as such.\n"
    "Invalid UTF-8 is replaced by U+FFFD before encoding. See docs/tokenizer.md.\n",
    {"add-special-tokens", "skip-special-tokens"}, run_tokenize});

}  // namespace
}  // namespace lockstep::cli
