// The one arithmetic every lockstep sum across ranks uses: element i of the
// result is the sum of part 0, part 1, ..., part P-1 in that order,
// accumulated in double and rounded once. Communicator::all_reduce_sum and
// the single-process data-parallel emulation both call this, which is what
// makes them agree bit for bit.
#pragma once

#include <cstddef>

#include "lockstep/comm/exact_sum.h"

namespace lockstep::comm {

// out[i] = T(((double(parts[0][i]) + parts[1][i]) + ...) + parts[P-1][i]).
// out may alias any part.
void sum_in_rank_order(const float* const* parts, int P, size_t n, float* out);
void sum_in_rank_order(const double* const* parts, int P, size_t n, double* out);
// The exact integer sum (comm/exact_sum.h): the order does not change it.
void sum_in_rank_order(const Fixed* const* parts, int P, size_t n, Fixed* out);

}  // namespace lockstep::comm
