// sum_in_rank_order.
#include "lockstep/comm/reduce_order.h"

#include "lockstep/base/error.h"

namespace lockstep::comm {

namespace {
template <typename T>
void sum_impl(const T* const* parts, int P, size_t n, T* out) {
  LS_CHECK(P >= 1) << "P=" << P;
  for (size_t i = 0; i < n; ++i) {
    double acc = double(parts[0][i]);
    for (int q = 1; q < P; ++q) acc += double(parts[q][i]);
    out[i] = T(acc);
  }
}
}  // namespace

void sum_in_rank_order(const float* const* parts, int P, size_t n, float* out) { sum_impl(parts, P, n, out); }
void sum_in_rank_order(const double* const* parts, int P, size_t n, double* out) { sum_impl(parts, P, n, out); }

void sum_in_rank_order(const Fixed* const* parts, int P, size_t n, Fixed* out) {
  LS_CHECK(P >= 1) << "P=" << P;
  for (size_t i = 0; i < n; ++i) {
    Fixed acc = parts[0][i];
    for (int q = 1; q < P; ++q) acc = fixed_add(acc, parts[q][i]);
    out[i] = acc;
  }
}

}  // namespace lockstep::comm
