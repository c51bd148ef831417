// The bitwise comparison behind [rl] on_gap.
#include "lockstep/rl/gap_check.h"

#include <cstdio>
#include <cstring>

#include "lockstep/base/error.h"

namespace lockstep::rl {

namespace {
uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
}  // namespace

std::optional<GapToken> first_gap(const std::vector<std::vector<float>>& rollout,
                                  const std::vector<std::vector<float>>& trainer, size_t first_sample) {
  LS_CHECK(rollout.size() == trainer.size()) << rollout.size() << " rollout samples vs " << trainer.size();
  for (size_t i = 0; i < rollout.size(); ++i) {
    LS_CHECK(rollout[i].size() == trainer[i].size())
        << "sample " << first_sample + i << ": " << rollout[i].size() << " rollout logprobs vs " << trainer[i].size();
    for (size_t t = 0; t < rollout[i].size(); ++t)
      if (bits(rollout[i][t]) != bits(trainer[i][t]))
        return GapToken{first_sample + i, int64_t(t), rollout[i][t], trainer[i][t]};
  }
  return std::nullopt;
}

std::string describe_gap(const GapToken& g, int64_t prompt_len) {
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "sample %zu of the step's batch, response token %lld (position %lld): rollout logprob %.9g "
                "(0x%08x), trainer %.9g (0x%08x)",
                g.sample, (long long)g.token, (long long)(prompt_len + g.token), double(g.rollout), bits(g.rollout),
                double(g.trainer), bits(g.trainer));
  return buf;
}

}  // namespace lockstep::rl
