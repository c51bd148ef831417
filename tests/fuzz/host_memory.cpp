// kernels::host_readable for the fuzz build. The parser library holds no GPU
// backend (kernels/gpu/backend.cpp would bring every kernel with it), so no
// device memory exists there and every tensor the safetensors writer hands
// over is host memory: the tensor itself is the readable view, as
// backend.cpp's version returns for any tensor outside a device allocator.
#include "lockstep/kernels/gpu/backend.h"

namespace lockstep::kernels {

Tensor host_readable(const Tensor& t, std::vector<unsigned char>& /*keep*/) {
  return t;
}

}  // namespace lockstep::kernels
