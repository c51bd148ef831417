// Planted for the float lint (scripts/gpu-lint.py --planted): float atomicAdd
// to global and shared memory (the sum's order depends on timing). On gfx90a
// the global one is a CAS loop (no float op in the ISA names it), so the IR's
// atomicrmw is checked too; bad_atomic_unsafe.cu has the hardware form. Not
// built into any library.
// LINT-EXPECT(ptx): atom\.global\.add\.f32
// LINT-EXPECT(ptx): atom\.shared\.add\.f32
// LINT-EXPECT(gfx90a): atomicrmw fadd ptr addrspace\(1\)
// LINT-EXPECT(gfx90a): atomicrmw fadd ptr addrspace\(3\)
// LINT-EXPECT(gfx90a): ds_add(_rtn)?_f32
#include "lockstep/kernels/gpu/portable.h"

LS_GLOBAL void planted_atomic(float* y, const float* x) {
  LS_SHARED(float, total, 1);
  if (threadIdx.x == 0) total[0] = 0.0f;
  __syncthreads();
  atomicAdd(&total[0], x[threadIdx.x]);
  atomicAdd(&y[1], x[threadIdx.x]);
  __syncthreads();
  if (threadIdx.x == 0) y[0] = total[0];
}
