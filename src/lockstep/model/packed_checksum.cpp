// The packed-weight checksum.
#include "lockstep/model/packed_checksum.h"

#include <vector>

#include "lockstep/base/error.h"
#include "lockstep/comm/checksum.h"

namespace lockstep::model {
namespace {

// Calls fn(pw) for every packed projection of `w` in layer order (attention,
// dense MLP, router, the V4 projections, routed experts where `experts`
// contains them and `w` packs them, shared expert, MTP blocks, lm_head).
template <typename Fn>
void for_each_packed(const ModelWeights& w, const ExpertShard& experts, Fn&& fn) {
  auto layer = [&](const PackedLayer& q) {
    for (const kernels::PackedWeight* pw : {&q.wqkv, &q.wo, &q.router, &q.shared_gate, &q.wq_a, &q.wq_b, &q.wkv,
                                            &q.wo_b, &q.cmp, &q.idx_wq_b, &q.idx_wproj, &q.idx_cmp})
      fn(*pw);
    for (const kernels::PackedWeight& pw : q.wo_a) fn(pw);
    fn(q.mlp.gate_up), fn(q.mlp.down), fn(q.shared.gate_up), fn(q.shared.down);
    for (size_t e = 0; e < q.experts.size(); ++e)
      if (experts.contains(int64_t(e)) &&
          (q.experts[e].gate_up.data.size() > 0 || q.experts[e].gate_up.in_place()))
        fn(q.experts[e].gate_up), fn(q.experts[e].down);
  };
  for (int64_t l = 0; l < w.config().num_layers; ++l) layer(w.layer(l));
  for (int64_t j = 0; j < int64_t(w.params().mtp.size()); ++j) {
    layer(w.mtp(j).block);
    fn(w.mtp(j).e_proj), fn(w.mtp(j).h_proj);
  }
  fn(w.lm_head());
}

// Chains one buffer's bytes into h (through a host copy when the host cannot
// read the buffer's memory).
uint64_t chain(uint64_t h, const Buffer& b) {
  if (b.size() == 0) return h;
  if (b.memory().host_visible()) return comm::checksum64(b.data(), b.size(), h);
  std::vector<char> host(b.size());
  b.memory().copy_out(host.data(), b.data(), b.size());
  return comm::checksum64(host.data(), host.size(), h);
}

}  // namespace

uint64_t packed_checksum(const ModelWeights& w, const ExpertShard& experts) {
  uint64_t h = 0;
  for_each_packed(w, experts,
                  [&](const kernels::PackedWeight& pw) {
                    LS_CHECK(!pw.in_place())
                        << "packed_checksum: the weights are read from the master in place; they have no "
                           "packed bits to compare";
                    const int64_t header[5] = {int64_t(pw.storage), pw.n, pw.k, pw.block_n, pw.block_k};
                    h = comm::checksum64(header, sizeof header, h);
                    h = comm::checksum64(pw.row_segments.data(), pw.row_segments.size() * sizeof(int64_t), h);
                    h = chain(chain(chain(h, pw.data), pw.panel_scales), pw.block_scales);
                  });
  return h;
}

size_t packed_bytes(const ModelWeights& w) {
  size_t n = 0;
  for_each_packed(w, {}, [&](const kernels::PackedWeight& pw) {
    n += pw.data.size() + pw.panel_scales.size() + pw.block_scales.size();
  });
  return n;
}

}  // namespace lockstep::model
