// pass@k: the probability that at least one of k samples drawn without
// replacement from n generated samples (c of them correct) is correct — the
// unbiased estimator of Chen et al. (2021), 1 - C(n-c, k) / C(n, k).
#pragma once

#include <cstdint>
#include <vector>

namespace lockstep::eval {

// 1 - C(n-c, k) / C(n, k) for n >= 1, 0 <= c <= n, 1 <= k <= n (Error
// otherwise). Computed as 1 - prod_{i=n-c+1..n} (1 - k/i), which never forms
// a binomial coefficient, so it neither overflows nor cancels for n in the
// thousands. Exact edge cases: c == 0 gives 0, n - c < k gives 1.
double pass_at_k(int64_t n, int64_t c, int64_t k);

// The ks reported for n samples per problem: 1, 2, 4, ... (powers of two
// <= n), then n itself when it is not a power of two (as verl does), so
// pass@n is always there.
std::vector<int64_t> pass_at_k_ks(int64_t n);

}  // namespace lockstep::eval
