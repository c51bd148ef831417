// The packed-weight checksum.
#include "lockstep/model/packed_checksum.h"

#include <vector>

#include "lockstep/comm/checksum.h"

namespace lockstep::model {
namespace {

// Chains one buffer's bytes into h (through a host copy when the host cannot
// read the buffer's memory).
uint64_t chain(uint64_t h, const Buffer& b) {
  if (b.size() == 0) return h;
  if (b.memory().host_visible()) return comm::checksum64(b.data(), b.size(), h);
  std::vector<char> host(b.size());
  b.memory().copy_out(host.data(), b.data(), b.size());
  return comm::checksum64(host.data(), host.size(), h);
}

uint64_t chain(uint64_t h, const kernels::PackedWeight& pw) {
  const int64_t header[5] = {int64_t(pw.storage), pw.n, pw.k, pw.block_n, pw.block_k};
  h = comm::checksum64(header, sizeof header, h);
  return chain(chain(chain(h, pw.data), pw.panel_scales), pw.block_scales);
}

uint64_t chain(uint64_t h, const PackedMlp& m) {
  return chain(chain(h, m.gate_up), m.down);
}

uint64_t chain_layer(uint64_t h, const PackedLayer& q, const ExpertShard& experts) {
  for (const kernels::PackedWeight* pw : {&q.wqkv, &q.wo, &q.router, &q.shared_gate, &q.wq_a, &q.wq_b, &q.wkv,
                                          &q.wo_b, &q.cmp, &q.idx_wq_b, &q.idx_wproj, &q.idx_cmp})
    h = chain(h, *pw);
  for (const kernels::PackedWeight& pw : q.wo_a) h = chain(h, pw);
  h = chain(chain(h, q.mlp), q.shared);
  for (size_t e = 0; e < q.experts.size(); ++e)
    if (experts.contains(int64_t(e)) && q.experts[e].gate_up.data.size() > 0) h = chain(h, q.experts[e]);
  return h;
}

}  // namespace

uint64_t packed_checksum(const ModelWeights& w, const ExpertShard& experts) {
  const ModelConfig& c = w.config();
  uint64_t h = 0;
  for (int64_t l = 0; l < c.num_layers; ++l) h = chain_layer(h, w.layer(l), experts);
  for (int64_t j = 0; j < int64_t(w.params().mtp.size()); ++j) {
    h = chain_layer(h, w.mtp(j).block, experts);
    h = chain(chain(h, w.mtp(j).e_proj), w.mtp(j).h_proj);
  }
  return chain(h, w.lm_head());
}

}  // namespace lockstep::model
