// MathVerifier: label handling, extraction, the string-level checks done
// before parsing (canonical spelling, multiple choice), then the parsed
// comparison of math_compare.cpp.
#include "lockstep/reward/math_verifier.h"

#include <cctype>
#include <optional>

#include "lockstep/reward/math_expr.h"

namespace lockstep::reward {

namespace {

// "1,22" / "0,111" written with a decimal comma: "1.22". Not "1,000" (thousands).
std::optional<std::string> decimal_comma(const std::string& s) {
  size_t start = (!s.empty() && s[0] == '-') ? 1 : 0;
  size_t comma = s.find(',');
  if (comma == std::string::npos || comma == start || comma + 1 >= s.size()) return std::nullopt;
  for (size_t i = start; i < s.size(); ++i)
    if (i != comma && !std::isdigit(static_cast<unsigned char>(s[i]))) return std::nullopt;
  std::string whole = s.substr(start, comma - start);
  if (s.size() - comma - 1 == 3 && whole != "0") return std::nullopt;
  std::string out = s;
  out[comma] = '.';
  return out;
}

bool equivalent_once(const std::string& gold, const std::string& pred, double rel_tol) {
  std::string cg = canonical_answer(gold), cp = canonical_answer(pred);
  if (!cg.empty() && cg == cp) return true;
  if (auto g = choice_letter(gold, /*strict=*/true)) {
    if (auto p = choice_letter(pred, /*strict=*/false)) return *g == *p;
  }
  auto ge = math::parse_answer(gold);
  if (!ge) return false;
  auto pe = math::parse_answer(pred);
  if (!pe) return false;
  return math::equivalent(*ge, *pe, rel_tol);
}

}  // namespace

bool math_answers_equivalent(std::string_view gold_text, std::string_view pred_text, double rel_tol) {
  std::string gold = strip_answer(gold_text);
  std::string pred = strip_answer(pred_text);
  if (gold.empty() || pred.empty()) return false;
  if (equivalent_once(gold, pred, rel_tol)) return true;
  // A decimal comma on one side ("1,22" for 1.22) when the other is a number.
  if (auto g = decimal_comma(gold)) return equivalent_once(*g, pred, rel_tol);
  if (auto p = decimal_comma(pred)) return equivalent_once(gold, *p, rel_tol);
  return false;
}

bool math_response_correct(std::string_view response, std::string_view label, double rel_tol) {
  auto ex = extract_answer(response, default_math_extractors());
  if (!ex) return false;
  return math_answers_equivalent(label_to_answer(label), ex->answer, rel_tol);
}

MathVerifier::MathVerifier(const RewardOptions& options)
    : tolerance_(options.tolerance),
      correct_reward_(options.correct_reward),
      incorrect_reward_(options.incorrect_reward),
      format_reward_(options.effective_format_reward()) {
  if (options.extractors.empty()) {
    extractors_ = default_math_extractors();
  } else {
    for (const auto& name : options.extractors) extractors_.push_back(*extractor_from_name(name));
  }
}

RewardResult MathVerifier::evaluate(const RewardRequest& request) const {
  // The label: a string or number, or a list of acceptable answers.
  std::vector<std::string> golds;
  auto add_gold = [&](const nlohmann::json& v) {
    if (v.is_string()) {
      std::string g = label_to_answer(v.get<std::string>());
      if (!g.empty()) golds.push_back(std::move(g));
    } else if (v.is_number()) {
      golds.push_back(v.dump());
    }
  };
  if (request.label.is_array()) {
    for (const auto& v : request.label) add_gold(v);
  } else {
    add_gold(request.label);
  }
  if (golds.empty()) {
    return RewardResult::failure_result("bad_label: math label must be a non-empty string, a number or a list of them, got " +
                                        request.label.dump().substr(0, 200));
  }
  RewardResult r;
  auto ex = extract_answer(request.response, extractors_);
  if (!ex) {
    r.reward = incorrect_reward_;
    return r;
  }
  r.extracted = ex->answer;
  for (const auto& g : golds) {
    if (math_answers_equivalent(g, ex->answer, tolerance_)) {
      r.correct = true;
      break;
    }
  }
  r.reward = r.correct ? correct_reward_ : format_reward_;
  return r;
}

}  // namespace lockstep::reward
