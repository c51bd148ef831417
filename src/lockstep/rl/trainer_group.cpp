// StepSums::reduce: the step's statistics as named sums, added over the
// trainer ranks in one collective.
#include "lockstep/rl/trainer_group.h"

#include <vector>

namespace lockstep::rl {
namespace {

// A mismatch mean is summed as mean * count and divided by the summed count.
struct MismatchSums {
  double abs_diff = 0;  // abs_diff_mean * samples
  double samples = 0;
  double kl_k3 = 0;          // kl_k3 * tokens
  double bitwise_equal = 0;  // bitwise_equal_frac * tokens
  double tokens = 0;
};

}  // namespace

void StepSums::reduce(TrainerGroup& group) {
  if (group.ranks() == 1) return;  // the sum of one part; recomputing the means would round
  MismatchSums ms;
  if (has_mismatch) {
    const train::MismatchStats& x = mismatch;
    ms = {x.abs_diff_mean * double(x.samples), double(x.samples), x.kl_k3 * double(x.tokens),
          x.bitwise_equal_frac * double(x.tokens), double(x.tokens)};
  }
  // Every rank sends the same fields (zeros where it has no mismatch): the
  // ranks agree on has_mismatch, as they train on the same samples.
  double clipped = double(loss.clipped);
  const std::vector<double*> fields = {&loss.pg_loss,  &loss.kl,       &loss.entropy, &clipped,
                                       &loss.ratio_sum, &loss.approx_kl, &ms.abs_diff,  &ms.samples,
                                       &ms.kl_k3,       &ms.bitwise_equal, &ms.tokens};
  std::vector<double> v;
  for (const double* f : fields) v.push_back(*f);
  group.sum(v.data(), v.size());
  for (size_t i = 0; i < fields.size(); ++i) *fields[i] = v[i];
  loss.clipped = int64_t(clipped);
  if (!has_mismatch) return;
  train::MismatchStats& x = mismatch;
  x.samples = int64_t(ms.samples);
  x.tokens = int64_t(ms.tokens);
  x.abs_diff_mean = ms.samples > 0 ? ms.abs_diff / ms.samples : 0.0;
  x.kl_k3 = ms.tokens > 0 ? ms.kl_k3 / ms.tokens : 0.0;
  x.bitwise_equal_frac = ms.tokens > 0 ? ms.bitwise_equal / ms.tokens : 1.0;
  x.abs_diff_max = group.max(x.abs_diff_max);
}

}  // namespace lockstep::rl
