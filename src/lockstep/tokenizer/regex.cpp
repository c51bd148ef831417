// PCRE2 wrapper. Match data and the JIT stack are per thread (thread_local) so
// one compiled pattern serves concurrent encodes without locks.
#include "lockstep/tokenizer/regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "lockstep/base/error.h"

namespace lockstep::tokenizer {
namespace {

std::string pcre2_message(int code) {
  PCRE2_UCHAR buf[256];
  int n = pcre2_get_error_message(code, buf, sizeof(buf));
  return n < 0 ? "PCRE2 error " + std::to_string(code) : std::string(reinterpret_cast<char*>(buf));
}

// Per-thread scratch: one match-data block (only the whole-match pair is read)
// and a JIT stack large enough for long runs such as `\s+(?!\S)` over megabytes
// of spaces (the 32 KiB default overflows there).
struct ThreadScratch {
  pcre2_match_data* match = nullptr;
  pcre2_match_context* context = nullptr;
  pcre2_jit_stack* jit_stack = nullptr;
  ThreadScratch() {
    match = pcre2_match_data_create(1, nullptr);
    context = pcre2_match_context_create(nullptr);
    jit_stack = pcre2_jit_stack_create(64 * 1024, 64 * 1024 * 1024, nullptr);
    LS_CHECK(match && context) << "out of memory creating PCRE2 match data";
    if (jit_stack != nullptr) pcre2_jit_stack_assign(context, nullptr, jit_stack);
    // Interpreter fallback (no JIT): allow deep backtracking on long inputs.
    pcre2_set_heap_limit(context, 1024 * 1024);  // KiB, i.e. 1 GiB
  }
  ~ThreadScratch() {
    pcre2_jit_stack_free(jit_stack);
    pcre2_match_context_free(context);
    pcre2_match_data_free(match);
  }
  ThreadScratch(const ThreadScratch&) = delete;
  ThreadScratch& operator=(const ThreadScratch&) = delete;
};

ThreadScratch& scratch() {
  thread_local ThreadScratch s;
  return s;
}

}  // namespace

struct Regex::Code {
  pcre2_code* code = nullptr;
  ~Code() { pcre2_code_free(code); }
};

Regex::Regex(const std::string& pattern, const std::string& what, bool literal) : pattern_(pattern), what_(what) {
  int err = 0;
  PCRE2_SIZE err_off = 0;
  // PCRE2_LITERAL admits no UCP (nothing in a literal depends on it).
  uint32_t opts = literal ? (PCRE2_UTF | PCRE2_LITERAL) : (PCRE2_UTF | PCRE2_UCP);
  pcre2_code* c = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), opts, &err, &err_off,
                                nullptr);
  if (c == nullptr) {
    LS_THROW << what << ": cannot compile pattern /" << pattern << "/ at offset " << err_off << ": "
             << pcre2_message(err);
  }
  // JIT is an optimisation only: when unavailable the interpreter gives the same matches.
  pcre2_jit_compile(c, PCRE2_JIT_COMPLETE);
  auto code = std::make_shared<Code>();
  code->code = c;
  code_ = std::move(code);
}

void Regex::find_all(std::string_view subject, std::vector<Span>& out) const {
  ThreadScratch& s = scratch();
  auto* subj = reinterpret_cast<PCRE2_SPTR>(subject.data());
  size_t n = subject.size();
  size_t pos = 0;
  size_t last_end = SIZE_MAX;  // end of the previous accepted match
  while (pos <= n) {
    int rc = pcre2_match(code_->code, subj, n, pos, PCRE2_NO_UTF_CHECK, s.match, s.context);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      LS_THROW << what_ << ": matching /" << pattern_ << "/ failed: " << pcre2_message(rc);
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(s.match);
    size_t b = ov[0], e = ov[1];
    if (b == e && e == last_end) {
      // Empty match right after the previous one: step one character, as
      // Oniguruma's iterator does, so the loop always advances.
      if (pos >= n) break;
      size_t step = 1;
      while (pos + step < n && (static_cast<unsigned char>(subject[pos + step]) & 0xC0) == 0x80) ++step;
      pos += step;
      continue;
    }
    out.push_back(Span{static_cast<uint32_t>(b), static_cast<uint32_t>(e)});
    last_end = e;
    pos = e;
  }
}

bool Regex::search(std::string_view subject) const {
  ThreadScratch& s = scratch();
  int rc = pcre2_match(code_->code, reinterpret_cast<PCRE2_SPTR>(subject.data()), subject.size(), 0,
                       PCRE2_NO_UTF_CHECK, s.match, s.context);
  if (rc == PCRE2_ERROR_NOMATCH) return false;
  if (rc < 0) LS_THROW << what_ << ": matching /" << pattern_ << "/ failed: " << pcre2_message(rc);
  return true;
}

}  // namespace lockstep::tokenizer
