// The unbiased pass@k estimator and the list of ks an evaluation reports.
#include "lockstep/eval/pass_at_k.h"

#include "lockstep/base/error.h"

namespace lockstep::eval {

double pass_at_k(int64_t n, int64_t c, int64_t k) {
  if (n < 1 || c < 0 || c > n || k < 1 || k > n)
    LS_THROW << "pass_at_k: need n >= 1, 0 <= c <= n, 1 <= k <= n; got n=" << n << " c=" << c << " k=" << k;
  if (c == 0) return 0.0;
  if (n - c < k) return 1.0;  // every k-subset holds a correct sample
  if (k == 1) return static_cast<double>(c) / static_cast<double>(n);  // one rounding: pass@1 is c/n exactly
  // C(n-c, k) / C(n, k) = prod_{i=n-c+1..n} (i - k) / i: c factors in (0, 1),
  // each a correctly rounded quotient of exact integers, so the product is
  // within ~2c ulps of the exact ratio.
  double fail = 1.0;
  for (int64_t i = n - c + 1; i <= n; ++i) fail *= static_cast<double>(i - k) / static_cast<double>(i);
  return 1.0 - fail;
}

std::vector<int64_t> pass_at_k_ks(int64_t n) {
  LS_CHECK(n >= 1) << "pass_at_k_ks: n = " << n;
  std::vector<int64_t> ks;
  for (int64_t k = 1; k <= n; k *= 2) ks.push_back(k);
  if (ks.back() != n) ks.push_back(n);
  return ks;
}

}  // namespace lockstep::eval
