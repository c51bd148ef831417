// A checksum of the packed bits a forward reads. The weight broadcast
// checksums the f32 master it carries; each side then packs its projections
// itself (f32, bf16 or fp8 with its block scales), and this checksum over
// those packed bytes shows that the rollout engine reads exactly the bits the
// trainer's forward reads.
#pragma once

#include <cstdint>

#include "lockstep/model/weights.h"

namespace lockstep::model {

// comm::checksum64 chained over every packed projection of `w` in one fixed
// order (every layer's, then the MTP blocks', then lm_head): each one's
// storage, shape, fp8 blocking and row segments, data and scales. Routed experts count only where `experts`
// contains them and `w` packs them, so a trainer that holds one shard of
// the experts and an engine that holds them all can compare over that shard.
uint64_t packed_checksum(const ModelWeights& w, const ExpertShard& experts = {});

// The bytes of those packed projections (data and fp8 scales): the memory
// the packed copy of the weights takes beside the f32 master.
size_t packed_bytes(const ModelWeights& w);

}  // namespace lockstep::model
