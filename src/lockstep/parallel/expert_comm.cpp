// model::ExpertComm over a comm::Communicator.
#include "lockstep/parallel/expert_comm.h"

#include "lockstep/base/error.h"

namespace lockstep::parallel {

namespace {
class MpiExpertComm final : public model::ExpertComm {
 public:
  explicit MpiExpertComm(comm::Communicator& c) : c_(c) {}
  int size() const override { return c_.size(); }
  int rank() const override { return c_.rank(); }
  void all_to_all_v(const void* send, const std::vector<size_t>& send_bytes, void* recv,
                    const std::vector<size_t>& recv_bytes) override {
    c_.all_to_all_v(send, send_bytes, recv, recv_bytes);
  }
  int64_t max(int64_t x) override { return c_.max(x); }
  double sum(double x) override { return c_.sum(x); }
  void all_gather(const void* in, size_t bytes, void* out) override { c_.all_gather_bytes(in, bytes, out); }
  void gather(const void* in, size_t bytes, void* out, int root) override { c_.gather_bytes(in, bytes, out, root); }

 private:
  comm::Communicator& c_;
};
}  // namespace

std::unique_ptr<model::ExpertComm> make_expert_comm(comm::Communicator& ep) {
  LS_CHECK(ep.valid()) << "make_expert_comm: this rank is not in the expert-parallel group";
  return std::make_unique<MpiExpertComm>(ep);
}

}  // namespace lockstep::parallel
