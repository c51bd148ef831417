// score_jsonl_file: parse and validate all lines, score them in chunks with a
// BatchScorer, write OUT.tmp, rename.
#include "lockstep/reward/jsonl.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "lockstep/base/error.h"
#include "lockstep/base/excerpt.h"
#include "lockstep/base/file_util.h"
#include "lockstep/base/timer.h"

namespace lockstep::reward {
namespace {

// Lines scored per BatchScorer call: bounds the copies a batch holds.
constexpr size_t kChunk = 4096;

using OrderedJson = nlohmann::ordered_json;

nlohmann::json to_plain(const OrderedJson& j) {
  return nlohmann::json::parse(j.dump());
}

}  // namespace

JsonlSummary score_jsonl_file(const std::string& in_path, const std::string& out_path,
                              const RewardOptions& options, const BatchOptions& batch) {
  auto reward = std::shared_ptr<const Reward>(make_reward(options));  // bad options fail before any I/O
  std::ifstream in(in_path, std::ios::binary);
  if (!in) LS_THROW << absolute_path(in_path) << ": cannot open for reading";
  std::vector<OrderedJson> rows;
  std::vector<RewardRequest> requests;
  std::string line;
  int64_t line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    OrderedJson row;
    try {
      row = OrderedJson::parse(line);
    } catch (const nlohmann::json::exception& e) {  // parse_error, or out_of_range for 1e400
      LS_THROW << in_path << ":" << line_no << ": not valid JSON (" << excerpt(e.what(), kJsonErrorBytes)
               << ")";
    }
    if (!row.is_object())
      LS_THROW << in_path << ":" << line_no << ": expected a JSON object, got " << row.type_name();
    auto resp = row.find("response");
    if (resp == row.end()) LS_THROW << in_path << ":" << line_no << ": missing field 'response'";
    if (!resp->is_string()) LS_THROW << in_path << ":" << line_no << ": field 'response' must be a string";
    auto label = row.find("label");
    if (label == row.end()) LS_THROW << in_path << ":" << line_no << ": missing field 'label'";
    RewardRequest req;
    req.response = resp->get<std::string>();
    req.label = to_plain(*label);
    if (auto m = row.find("metadata"); m != row.end()) req.metadata = to_plain(*m);
    if (auto p = row.find("prompt"); p != row.end()) {
      if (!p->is_string()) LS_THROW << in_path << ":" << line_no << ": field 'prompt' must be a string";
      req.prompt = p->get<std::string>();
    }
    rows.push_back(std::move(row));
    requests.push_back(std::move(req));
  }
  if (in.bad()) LS_THROW << in_path << ": read error";

  BatchScorer scorer(reward, batch);
  JsonlSummary summary;
  double scoring_s = 0;
  std::vector<RewardResult> results;
  results.reserve(requests.size());
  for (size_t start = 0; start < requests.size(); start += kChunk) {
    size_t end = std::min(requests.size(), start + kChunk);
    std::vector<RewardRequest> chunk(
        std::make_move_iterator(requests.begin() + static_cast<std::ptrdiff_t>(start)),
        std::make_move_iterator(requests.begin() + static_cast<std::ptrdiff_t>(end)));
    Timer t;
    auto part = scorer.score(chunk, &summary.stats);
    scoring_s += t.seconds();
    for (auto& r : part) results.push_back(std::move(r));
  }
  summary.responses_per_s = scoring_s > 0 ? static_cast<double>(results.size()) / scoring_s : 0.0;

  std::string tmp = out_path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) LS_THROW << tmp << ": cannot open for writing";
    for (size_t i = 0; i < rows.size(); ++i) {
      OrderedJson& row = rows[i];
      const RewardResult& r = results[i];
      row["reward"] = r.failed() ? OrderedJson(nullptr) : OrderedJson(r.reward);
      row["correct"] = r.correct;
      row["extracted"] = r.extracted;
      row["failure"] = r.failed() ? OrderedJson(r.failure) : OrderedJson(nullptr);
      out << row.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << '\n';
    }
    out.flush();
    if (!out) {
      out.close();
      std::remove(tmp.c_str());
      LS_THROW << tmp << ": write failed";
    }
  }
  std::error_code ec;
  std::filesystem::rename(tmp, out_path, ec);
  if (ec) {
    std::remove(tmp.c_str());
    LS_THROW << out_path << ": cannot rename " << tmp << " into place (" << ec.message() << ")";
  }
  return summary;
}

}  // namespace lockstep::reward
