// Length-prefixed byte messages.
#include "lockstep/comm/messages.h"

#include "lockstep/base/error.h"

namespace lockstep::comm {

namespace {
// A length above this is a protocol error (a peer sent garbage), not a
// message: refuse it before allocating.
constexpr uint64_t kMaxMessageBytes = uint64_t(1) << 40;

void check_length(uint64_t n, const Communicator& comm, int peer) {
  if (n > kMaxMessageBytes)
    LS_THROW << "message on '" << comm.name() << "' from rank " << peer << " announces " << n
             << " bytes: the ranks disagree on the protocol (different lockstep builds?)";
}
}  // namespace

void send_message(Communicator& comm, const std::vector<char>& bytes, int dest, int tag) {
  const uint64_t n = bytes.size();
  comm.send(&n, sizeof n, dest, tag);
  comm.send(bytes.data(), bytes.size(), dest, tag);
}

std::vector<char> recv_message(Communicator& comm, int src, int tag) {
  uint64_t n = 0;
  comm.recv(&n, sizeof n, src, tag);
  check_length(n, comm, src);
  std::vector<char> out(static_cast<size_t>(n));
  comm.recv(out.data(), out.size(), src, tag);
  return out;
}

void broadcast_message(Communicator& comm, std::vector<char>& bytes, int root) {
  uint64_t n = bytes.size();
  comm.broadcast_value(n, root);
  check_length(n, comm, root);
  if (comm.rank() != root) bytes.resize(static_cast<size_t>(n));
  comm.broadcast(bytes.data(), bytes.size(), root);
}

}  // namespace lockstep::comm
