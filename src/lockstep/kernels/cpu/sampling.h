// Token sampling from rows of logits: greedy, temperature, top-k, top-p,
// min-p, with the draw's Philox random number taken inside the kernel. The
// GPU kernel (kernels/gpu/sampling.cu) gives the same token for every input.
#pragma once

#include <vector>

#include "lockstep/base/thread_pool.h"
#include "lockstep/kernels/sampling_rules.h"
#include "lockstep/tensor/tensor.h"

namespace lockstep::kernels {

// The definition, for one draw s on the row z (V) of f32 logits. Every float
// step is one IEEE f32 operation, every sum one IEEE double addition in the
// order given (kernels/sampling_rules.h holds the shared pieces):
//   v_i   = z_i, with NaN read as -inf and -0 as +0
//   greedy (temperature 0 or top_k 1): the lowest id among the largest v_i.
//   Otherwise the candidates c_0, c_1, ... are
//     - the ids 0..V-1 in order when top-k, top-p and min-p are all off,
//     - else the ids sorted by (v desc, id asc), the first K of them
//       (K = top_k when 0 < top_k < V, else V).
//   x_i   = v_i / T (f32);  m = max_i x_i over the whole row
//   w_j   = 1 if x_{c_j} == m, else num::exp(x_{c_j} - m)   (f32, in [0, 1]; w_0 = 1 when sorted)
//   cum_j = P_c + q_j (double), c = j / 256 the chunk of j, q_j the sequential
//           double sum of w over chunk c up to j, P_c the sequential sum of the
//           earlier chunks' full sums (P_0 = 0). The sum of the first n
//           candidates is cum_{n-1}.
//   min-p:  keep the leading candidates with w_j >= min_p (K1 of them; w_0 = 1 keeps one)
//   top-p:  keep the shortest prefix K2 with cum_{K2-1} >= top_p * cum_{K1-1}
//   S = cum_{K2-1};  t = u * S, or the largest double below S if that rounds to S
//   token = c_j for the first j with t < cum_j (a candidate of positive weight).
// So the chance of c_j is (cum_j - cum_{j-1}) / S up to the 2^-53 grid of u.
// A GPU block computes the chunk sums in parallel, their prefix in order, and
// scans one chunk for the target. The reported logprob is not this function's
// (token_logprob_forward, untruncated).

// tokens_out[i] = the token of draw rows[i] on logits row rows[i].logit_row.
// tokens_out (R) i32 contiguous, R = rows.size(); logits (N, V) f32, rows may
// be strided (stride[0] >= V). Each draw reads only its own row and spec: no
// dependence on the batch or the thread count.
void sample_rows(const Context& ctx, Tensor tokens_out, const Tensor& logits, const std::vector<SampleSpec>& rows);

// One draw with its random number u in [0, 1) given (the row form of
// sample_rows, which passes sampling::draw(s)). logits (V).
int32_t sample_row(const float* logits, int64_t V, const SampleSpec& s, double u);

namespace detail {
// The checks of sample_rows (shared with the GPU entry); returns V.
int64_t check_sample_rows(const Tensor& tokens_out, const Tensor& logits, const std::vector<SampleSpec>& rows);
}  // namespace detail

}  // namespace lockstep::kernels
