// CountdownReward: equation extraction, a small exact-arithmetic parser
// (numbers, + - * /, parentheses; depth-limited) and the number-use check.
#include "lockstep/reward/countdown.h"

#include <algorithm>
#include <cctype>

#include "lockstep/reward/math_text.h"

namespace lockstep::reward {
namespace {

constexpr size_t kMaxEquationChars = 1000;
constexpr int kMaxNesting = 64;

struct SyntaxError {};

// Rewrites operator spellings to + - * / and rejects anything else.
std::optional<std::string> normalize_equation(std::string_view s) {
  struct Rep {
    const char* from;
    char to;
  };
  static const Rep reps[] = {{"\\times", '*'}, {"\\cdot", '*'}, {"\\div", '/'}, {"\xC3\x97", '*'}, {"\xC2\xB7", '*'},
                             {"\xC3\xB7", '/'}, {"\xE2\x88\x92", '-'}, {"\\left", ' '}, {"\\right", ' '},
                             {"\\(", ' '}, {"\\)", ' '}, {"\\[", ' '}, {"\\]", ' '}, {"\\,", ' '}, {"\\!", ' '},
                             {"\\ ", ' '}};
  std::string out;
  size_t i = 0;
  while (i < s.size()) {
    bool done = false;
    for (const auto& r : reps) {
      std::string_view f(r.from);
      if (s.substr(i, f.size()) == f) {
        out.push_back(r.to);
        i += f.size();
        done = true;
        break;
      }
    }
    if (done) continue;
    char c = s[i++];
    if (std::isdigit(static_cast<unsigned char>(c)) || c == '+' || c == '-' || c == '*' || c == '/' || c == '(' ||
        c == ')' || c == '=' || c == ' ' || c == '\t' || c == '\n') {
      out.push_back(c == '\t' || c == '\n' ? ' ' : c);
    } else if (c == '$') {
      continue;
    } else if (c == '[' || c == '{') {
      out.push_back('(');
    } else if (c == ']' || c == '}') {
      out.push_back(')');
    } else {
      return std::nullopt;
    }
  }
  return out;
}

class EquationParser {
 public:
  explicit EquationParser(std::string_view s) : s_(s) {}

  // Value of the whole text; nullopt value on division by zero. Throws SyntaxError.
  std::optional<Rational> run(std::vector<int64_t>* used) {
    used_ = used;
    auto v = expr();
    skip();
    if (i_ != s_.size()) throw SyntaxError{};
    return v;
  }

 private:
  void skip() {
    while (i_ < s_.size() && s_[i_] == ' ') ++i_;
  }

  std::optional<Rational> expr() {
    auto v = term();
    for (;;) {
      skip();
      if (i_ >= s_.size() || (s_[i_] != '+' && s_[i_] != '-')) return v;
      char op = s_[i_++];
      auto w = term();
      if (!v || !w) {
        v = std::nullopt;
        continue;
      }
      v = op == '+' ? Rational::add(*v, *w) : Rational::sub(*v, *w);
    }
  }

  std::optional<Rational> term() {
    auto v = factor();
    for (;;) {
      skip();
      if (i_ >= s_.size() || (s_[i_] != '*' && s_[i_] != '/')) return v;
      char op = s_[i_++];
      auto w = factor();
      if (!v || !w) {
        v = std::nullopt;
        continue;
      }
      v = op == '*' ? Rational::mul(*v, *w) : Rational::div(*v, *w);  // x/0 -> nullopt
    }
  }

  std::optional<Rational> factor() {
    skip();
    if (i_ >= s_.size()) throw SyntaxError{};
    if (s_[i_] == '(') {
      if (++depth_ > kMaxNesting) throw SyntaxError{};
      ++i_;
      auto v = expr();
      skip();
      if (i_ >= s_.size() || s_[i_] != ')') throw SyntaxError{};
      ++i_;
      --depth_;
      return v;
    }
    size_t start = i_;
    while (i_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[i_]))) ++i_;
    if (i_ == start || i_ - start > 18) throw SyntaxError{};  // no unary minus; at most 18 digits
    int64_t v = std::stoll(std::string(s_.substr(start, i_ - start)));
    used_->push_back(v);
    return Rational(v);
  }

  std::string_view s_;
  size_t i_ = 0;
  int depth_ = 0;
  std::vector<int64_t>* used_ = nullptr;
};

bool bare_number(std::string_view s) {
  size_t i = 0;
  while (i < s.size() && s[i] == ' ') ++i;
  size_t digits = 0;
  while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) ++i, ++digits;
  while (i < s.size() && s[i] == ' ') ++i;
  return digits > 0 && i == s.size();
}

// {"target": 24, "numbers": [1, 2, 3, 4]} (also "nums"), possibly as a JSON string.
bool parse_label(const nlohmann::json& in, int64_t* target, std::vector<int64_t>* numbers) {
  nlohmann::json j = in;
  if (j.is_string()) {
    j = nlohmann::json::parse(j.get<std::string>(), nullptr, /*allow_exceptions=*/false);
  }
  if (!j.is_object()) return false;
  auto t = j.find("target");
  auto n = j.find("numbers");
  if (n == j.end()) n = j.find("nums");
  if (t == j.end() || n == j.end() || !t->is_number_integer() || !n->is_array() || n->empty() || n->size() > 64)
    return false;
  *target = t->get<int64_t>();
  numbers->clear();
  for (const auto& x : *n) {
    if (!x.is_number_integer()) return false;
    numbers->push_back(x.get<int64_t>());
  }
  return true;
}

}  // namespace

CountdownCheck check_countdown(std::string_view equation, int64_t target, const std::vector<int64_t>& numbers) {
  CountdownCheck c;
  if (equation.size() > kMaxEquationChars) return c;
  auto norm = normalize_equation(equation);
  if (!norm) return c;
  // "expr = 24" or "24 = expr": score the side that is not a bare number.
  std::vector<std::string> parts;
  std::string cur;
  for (char ch : *norm + "=") {
    if (ch == '=') {
      parts.push_back(cur);
      cur.clear();
    } else {
      cur.push_back(ch);
    }
  }
  std::string side = parts[0];
  for (const auto& p : parts) {
    if (!bare_number(p)) {
      side = p;
      break;
    }
  }
  std::vector<int64_t> used;
  try {
    c.value = EquationParser(side).run(&used);
  } catch (const SyntaxError&) {
    return c;
  } catch (const std::out_of_range&) {
    return c;
  }
  c.well_formed = true;
  std::vector<int64_t> a = used, b = numbers;
  std::sort(a.begin(), a.end());
  std::sort(b.begin(), b.end());
  c.numbers_ok = a == b;
  c.reaches_target = c.value && *c.value == Rational(target);
  return c;
}

std::string countdown_equation(std::string_view response) {
  size_t close = response.rfind("</answer>");
  if (close != std::string_view::npos) {
    size_t open = response.rfind("<answer>", close);
    if (open != std::string_view::npos) return strip_answer(response.substr(open + 8, close - open - 8));
  }
  if (auto b = extract_boxed(response)) return strip_answer(*b);
  std::string_view rest = response;
  while (!rest.empty()) {
    size_t nl = rest.rfind('\n');
    std::string_view line = nl == std::string_view::npos ? rest : rest.substr(nl + 1);
    std::string s = strip_answer(line);
    if (!s.empty()) return s;
    if (nl == std::string_view::npos) break;
    rest = rest.substr(0, nl);
  }
  return {};
}

CountdownReward::CountdownReward(const RewardOptions& options)
    : correct_reward_(options.correct_reward),
      incorrect_reward_(options.incorrect_reward),
      format_reward_(options.format_reward.value_or(0.1)) {}

RewardResult CountdownReward::evaluate(const RewardRequest& request) const {
  int64_t target = 0;
  std::vector<int64_t> numbers;
  const nlohmann::json& label = request.label.is_null() ? request.metadata : request.label;
  if (!parse_label(label, &target, &numbers)) {
    return RewardResult::failure_result(
        "bad_label: countdown label must be {\"target\": int, \"numbers\": [int, ...]}, got " +
        label.dump().substr(0, 200));
  }
  RewardResult r;
  r.extracted = countdown_equation(request.response).substr(0, kMaxEquationChars);
  CountdownCheck c = check_countdown(r.extracted, target, numbers);
  r.correct = c.well_formed && c.numbers_ok && c.reaches_target;
  r.reward = r.correct ? correct_reward_ : (c.well_formed ? format_reward_ : incorrect_reward_);
  return r;
}

}  // namespace lockstep::reward
