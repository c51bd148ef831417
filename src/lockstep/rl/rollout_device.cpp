// The rollout engine's device ([rollout] device, rollout_device.h).
#include "lockstep/rl/rollout_device.h"

#include "lockstep/base/error.h"
#include "lockstep/base/log.h"
#include "lockstep/kernels/gpu/device.h"

namespace lockstep::rl {

Context rollout_context(const train::Trainer& trainer, const rollout::RolloutSection& cfg) {
  Context ctx = trainer.context();
  if (cfg.device.empty()) return ctx;
  const std::string where = cfg.device_where.empty() ? std::string("[rollout] device") : cfg.device_where;
  ctx.gpu = kernels::device_backend(kernels::parse_device(cfg.device, where), where);
  if (!crosses_devices(ctx, trainer)) return ctx;
  // The engine packs its weights from the trainer's f32 master, which the
  // host must read: the trainer's own device memory it could not.
  if (trainer.context().gpu != nullptr)
    LS_THROW
        << where << " = \"" << cfg.device << "\" with the trainer on \"" << trainer.context().gpu->name
        << "\": a rollout on another device than the trainer needs the trainer on the CPU ([model] device "
           "= \"cpu\")";
  LS_LOG(Info) << "rollout: the engine on " << ctx.gpu->name
               << ", the trainer on the CPU (the trainer's weights copied in at every sync)";
  return ctx;
}

}  // namespace lockstep::rl
