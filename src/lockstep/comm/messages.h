// Variable-size byte messages over a Communicator: a 64-bit length, then the
// bytes (cut into buckets by send/recv/broadcast). The RL loop uses them to
// move serialized rollout requests and results between ranks.
#pragma once

#include <cstdint>
#include <vector>

#include "lockstep/comm/communicator.h"

namespace lockstep::comm {

void send_message(Communicator& comm, const std::vector<char>& bytes, int dest, int tag);
std::vector<char> recv_message(Communicator& comm, int src, int tag);
// root's `bytes` to every rank of comm (resized on the receivers).
void broadcast_message(Communicator& comm, std::vector<char>& bytes, int root);

}  // namespace lockstep::comm
