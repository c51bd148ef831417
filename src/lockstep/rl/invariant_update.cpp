// invariant_shard, SeqStatsTable and gather_logprobs.
#include "lockstep/rl/invariant_update.h"

#include <cstring>
#include <string>

#include "lockstep/base/error.h"
#include "lockstep/parallel/data_parallel.h"

namespace lockstep::rl {

std::pair<size_t, size_t> invariant_shard(const TrainerGroup& group,
                                          const std::vector<train::TrainSequence>& seqs,
                                          int64_t micro_batch_tokens) {
  const parallel::Range r =
      parallel::split_micro_batches(seqs, micro_batch_tokens, group.ranks())[size_t(group.rank())];
  return {r.begin, r.end};
}

void SeqStatsTable::set(size_t i, double loss, const SeqLossStats& st) {
  LS_CHECK((i + 1) * kFields <= v_.size())
      << "SeqStatsTable: sequence " << i << " of " << v_.size() / kFields;
  double* e = v_.data() + i * kFields;
  e[0] = loss;
  e[1] = st.pg_loss;
  e[2] = st.kl;
  e[3] = st.entropy;
  e[4] = double(st.clipped);  // a token count: exact in double
  e[5] = st.ratio_sum;
  e[6] = st.approx_kl;
}

double SeqStatsTable::add_in_order(TrainerGroup& group, int64_t n_mb, SeqLossStats& ls) {
  group.sum(v_.data(), v_.size());
  double loss = 0;
  for (size_t i = 0; i < v_.size(); i += kFields) {
    const double* e = v_.data() + i;
    loss += e[0];
    ls.pg_loss += e[1] / double(n_mb);
    ls.kl += e[2] / double(n_mb);
    ls.entropy += e[3] / double(n_mb);
    ls.clipped += int64_t(e[4]);
    ls.ratio_sum += e[5];
    ls.approx_kl += e[6];
  }
  return loss;
}

std::vector<std::vector<float>> gather_logprobs(TrainerGroup& group,
                                                const std::vector<std::vector<float>>& mine,
                                                const std::vector<size_t>& lengths) {
  std::string bytes;
  for (const auto& v : mine) bytes.append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
  std::string all;
  for (const std::string& part : group.gather_strings(bytes)) all += part;
  size_t total = 0;
  for (size_t n : lengths) total += n;
  LS_CHECK(all.size() == total * sizeof(float))
      << "rl: gathered " << all.size() / sizeof(float) << " logprobs for " << total << " tokens";
  std::vector<std::vector<float>> out;
  size_t at = 0;
  for (size_t n : lengths) {
    out.emplace_back(n);
    if (n > 0) std::memcpy(out.back().data(), all.data() + at, n * sizeof(float));
    at += n * sizeof(float);
  }
  return out;
}

}  // namespace lockstep::rl
