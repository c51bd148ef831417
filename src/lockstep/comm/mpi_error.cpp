// mpi_error_string / check_mpi.
#include "lockstep/comm/mpi_error.h"

#if LOCKSTEP_HAVE_MPI  // else comm/no_mpi.cpp

#include <mpi.h>

#include "lockstep/base/error.h"

namespace lockstep::comm {

std::string mpi_error_string(int code) {
  char buf[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, buf, &len) != MPI_SUCCESS) return "MPI error code " + std::to_string(code);
  return std::string(buf, size_t(len)) + " (MPI error code " + std::to_string(code) + ")";
}

void check_mpi(int code, const char* what) {
  if (code != MPI_SUCCESS) LS_THROW << what << ": " << mpi_error_string(code);
}

}  // namespace lockstep::comm

#endif  // LOCKSTEP_HAVE_MPI
