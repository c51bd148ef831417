# The device builds of the GPU kernel sources (src/lockstep/kernels/gpu/*.cu):
# CUDA (LOCKSTEP_CUDA, nvcc) and HIP (LOCKSTEP_HIP, hipcc), and the float lint of
# their device code (scripts/gpu-lint.py, ctest label gpu-interp). docs/gpu.md
# says why each flag. lockstep links the libraries with their runtimes
# (cmake/gpu/CMakeLists.txt); the tests do not.

# --- CUDA -------------------------------------------------------------------------
if(CMAKE_CUDA_COMPILER)
  set(LOCKSTEP_NVCC "${CMAKE_CUDA_COMPILER}" CACHE FILEPATH "nvcc for the CUDA build and the PTX lint")
endif()
find_program(LOCKSTEP_NVCC nvcc DOC "nvcc for the CUDA build and the PTX lint")
if(LOCKSTEP_NVCC)
  set(_ls_cuda_default ON)
else()
  set(_ls_cuda_default OFF)
endif()
option(LOCKSTEP_CUDA "Build lockstep_kernels_cuda from the GPU kernel sources (default: ON when nvcc is found)"
       ${_ls_cuda_default})
# Accepts 90, sm_90 or a list (90;100): CMake's CUDA_ARCHITECTURES form is used.
set(LOCKSTEP_CUDA_ARCH "90" CACHE STRING "CUDA architectures of lockstep_kernels_cuda (90 = H100/H200)")
string(REGEX REPLACE "(^|;)(sm_|compute_)" "\\1" LOCKSTEP_CUDA_ARCHITECTURES "${LOCKSTEP_CUDA_ARCH}")

# Device and host code: IEEE round-to-nearest-even everywhere, no contraction,
# no flushing, correctly rounded / and sqrt. The -Xcompiler flags are for the
# host compiler nvcc runs (g++ contracts C++ by default). --expt-relaxed-constexpr
# lets device code call constexpr functions as clang (HIP) does by default.
# (C++20 comes from CMAKE_CXX_STANDARD: CMake's CUDA_STANDARD falls back to it.)
set(LOCKSTEP_CUDA_FLAGS
    --fmad=false --ftz=false --prec-div=true --prec-sqrt=true
    -Xcompiler=-ffp-contract=off,-fno-fast-math
    --expt-relaxed-constexpr --Werror=cross-execution-space-call)

if(LOCKSTEP_CUDA)
  if(NOT LOCKSTEP_NVCC)
    message(FATAL_ERROR
      "LOCKSTEP_CUDA=ON but nvcc was not found. Put CUDA's bin/ on PATH, pass "
      "-DLOCKSTEP_NVCC=/path/to/nvcc, or configure with -DLOCKSTEP_CUDA=OFF.")
  endif()
  set(CMAKE_CUDA_COMPILER "${LOCKSTEP_NVCC}")
  set(CMAKE_CUDA_HOST_COMPILER "${CMAKE_CXX_COMPILER}")
  set(CMAKE_CUDA_ARCHITECTURES "${LOCKSTEP_CUDA_ARCHITECTURES}")
  if(CCACHE)
    set(CMAKE_CUDA_COMPILER_LAUNCHER ${CCACHE})
  endif()
  enable_language(CUDA)
  if(NOT CMAKE_CUDA_COMPILER_ID STREQUAL "NVIDIA" OR CMAKE_CUDA_COMPILER_VERSION VERSION_LESS 12.0)
    message(FATAL_ERROR "LOCKSTEP_CUDA needs nvcc 12.0 or newer (C++20); found "
                        "${CMAKE_CUDA_COMPILER_ID} ${CMAKE_CUDA_COMPILER_VERSION} at ${CMAKE_CUDA_COMPILER}")
  endif()
  # CMake 3.25 knows nvcc's C++20 flag only from 3.26 on.
  if(NOT DEFINED CMAKE_CUDA20_STANDARD_COMPILE_OPTION)
    set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
    set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
  endif()
  find_package(CUDAToolkit REQUIRED)
endif()

# --- HIP --------------------------------------------------------------------------
find_program(LOCKSTEP_HIPCC hipcc DOC "hipcc for the HIP build and the gfx90a lint")
# On by default when hipcc is found (scripts/install-deps.sh installs Debian's), so
# `make test` compiles the HIP target as it compiles the CUDA one.
if(LOCKSTEP_HIPCC)
  set(_ls_hip_default ON)
else()
  set(_ls_hip_default OFF)
endif()
option(LOCKSTEP_HIP "Build lockstep_kernels_hip from the GPU kernel sources with hipcc (default: ON when hipcc is found)"
       ${_ls_hip_default})
# gfx90a = MI200 (MI210/MI250X). gfx942 (MI300) and gfx950 (MI355X) need a newer
# ROCm than Debian 12's (hipcc 5.2.3 on LLVM 15 rejects both; it knows gfx940).
set(LOCKSTEP_HIP_ARCH "gfx90a" CACHE STRING "AMD GPU target of lockstep_kernels_hip")
set(LOCKSTEP_HIP_FLAGS
    -x hip --offload-arch=${LOCKSTEP_HIP_ARCH} -std=c++20 -O3
    -ffp-contract=off -fno-fast-math -fhip-fp32-correctly-rounded-divide-sqrt
    -fno-gpu-flush-denormals-to-zero -mno-unsafe-fp-atomics
    # LS_LAUNCH ignores its ctx on the devices: every host wrapper would warn.
    -Wall -Wextra -Wno-unused-parameter)
if(LOCKSTEP_HIP AND NOT LOCKSTEP_HIPCC)
  message(FATAL_ERROR
    "LOCKSTEP_HIP=ON but hipcc was not found: run scripts/install-deps.sh (Debian's hipcc), "
    "pass -DLOCKSTEP_HIPCC=/path/to/hipcc, or configure with -DLOCKSTEP_HIP=OFF.")
endif()

# The targets live in their own directory: the top directory marks the .cu files
# as C++ for the interpret build, and source properties are per directory.
add_subdirectory(${CMAKE_SOURCE_DIR}/cmake/gpu ${CMAKE_BINARY_DIR}/gpu)

# --- the float lint ---------------------------------------------------------------
# One test per source and check, with the build's own flags, whenever the
# compiler is there (the lint needs no library). The planted bad sources under
# tests/gpu/lint/ must be rejected with the messages their LINT-EXPECT lines name.
find_program(LOCKSTEP_PYTHON3 python3 DOC "python3 for scripts/gpu-lint.py")
if(LOCKSTEP_BUILD_TESTS AND NOT LOCKSTEP_PYTHON3)
  message(STATUS "GPU float lint: no python3, the gpu_lint tests are skipped")
elseif(LOCKSTEP_BUILD_TESTS)
  file(GLOB _ls_lint_good CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/src/lockstep/kernels/gpu/*.cu
                                            ${CMAKE_SOURCE_DIR}/tests/gpu/lint/good_*.cu)
  file(GLOB _ls_lint_bad CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/tests/gpu/lint/bad_*.cu)
  list(GET LOCKSTEP_CUDA_ARCHITECTURES 0 _ls_lint_sm)
  set(_ls_lint_checks "")
  if(LOCKSTEP_NVCC)
    list(APPEND _ls_lint_checks ptx)
    set(_ls_lint_ptx ${LOCKSTEP_NVCC} -- -std=c++20 ${LOCKSTEP_CUDA_FLAGS} -arch=sm_${_ls_lint_sm} -I${CMAKE_SOURCE_DIR}/src)
  endif()
  if(LOCKSTEP_HIPCC)
    list(APPEND _ls_lint_checks gfx90a)
    # The ISA rules are gfx90a's (CDNA2); the lint always targets it.
    string(REPLACE "--offload-arch=${LOCKSTEP_HIP_ARCH}" "--offload-arch=gfx90a" _ls_hip_lint_flags
                   "${LOCKSTEP_HIP_FLAGS}")
    set(_ls_lint_gfx90a ${LOCKSTEP_HIPCC} -- ${_ls_hip_lint_flags} -I${CMAKE_SOURCE_DIR}/src)
  endif()
  set(_ls_lint ${LOCKSTEP_PYTHON3} ${CMAKE_SOURCE_DIR}/scripts/gpu-lint.py)
  foreach(check ${_ls_lint_checks})
    list(GET _ls_lint_${check} 0 _ls_compiler)
    list(SUBLIST _ls_lint_${check} 1 -1 _ls_flags)
    foreach(src ${_ls_lint_good})
      get_filename_component(stem ${src} NAME_WE)
      add_test(NAME gpu_lint.${check}.${stem}
               COMMAND ${_ls_lint} ${check} --compiler ${_ls_compiler} ${src} ${_ls_flags})
      set_tests_properties(gpu_lint.${check}.${stem} PROPERTIES LABELS gpu-interp)
    endforeach()
    foreach(src ${_ls_lint_bad})
      file(STRINGS ${src} _ls_expect REGEX "LINT-EXPECT\\(${check}\\)")
      if(_ls_expect)
        get_filename_component(stem ${src} NAME_WE)
        add_test(NAME gpu_lint.${check}.planted.${stem}
                 COMMAND ${_ls_lint} ${check} --planted --compiler ${_ls_compiler} ${src} ${_ls_flags})
        set_tests_properties(gpu_lint.${check}.planted.${stem} PROPERTIES LABELS gpu-interp)
      endif()
    endforeach()
  endforeach()
  if(NOT _ls_lint_checks)
    message(STATUS "GPU float lint: neither nvcc nor hipcc found, the gpu_lint tests are skipped")
  endif()
endif()
