// Built, never run: takes the backend table of one device build (namespace
// LOCKSTEP_LINK_CHECK_NS: cuda or hip) so that the link resolves every host
// symbol its .cu files reference.
#include <cstdio>

#include "lockstep/kernels/gpu/backend.h"

namespace lockstep::kernels::gpu::LOCKSTEP_LINK_CHECK_NS {
GpuBackend make_backend();  // kernels/gpu/backend.cu
}  // namespace lockstep::kernels::gpu::LOCKSTEP_LINK_CHECK_NS

int main() {
  const lockstep::kernels::GpuBackend b = lockstep::kernels::gpu::LOCKSTEP_LINK_CHECK_NS::make_backend();
  std::printf("%s: %zu entries covered\n", b.name, b.covered().size());
  return 0;
}
