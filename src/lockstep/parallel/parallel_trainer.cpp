// make_parallel_trainer (parallel_trainer.h).
#include "lockstep/parallel/parallel_trainer.h"

#include "lockstep/base/error.h"
#include "lockstep/parallel/data_parallel.h"
#include "lockstep/parallel/expert_comm.h"

namespace lockstep::parallel {

std::unique_ptr<model::ExpertComm> make_parallel_trainer(train::Trainer& trainer, RoleComms& rc,
                                                         const std::string& config_path) {
  const Roles& r = rc.roles;
  const int64_t E = trainer.config().num_experts;
  std::unique_ptr<model::ExpertComm> experts;
  if (r.ep_size > 1) {
    if (E == 0 || E % r.ep_size != 0)
      LS_THROW << config_path << ": [dist] expert_parallel = " << r.ep_size
               << " needs a MoE model whose experts it divides; the model has " << E << " experts";
    experts = make_expert_comm(rc.ep);
    trainer.set_expert_comm(experts.get());
  }
  if (r.trainer_ranks > 1) make_data_parallel(trainer, rc.trainers, &rc.dp);
  return experts;
}

}  // namespace lockstep::parallel
