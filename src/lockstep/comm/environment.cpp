// Environment: MPI_Init_thread / MPI_Finalize.
#include "lockstep/comm/environment.h"

#if LOCKSTEP_HAVE_MPI  // else comm/no_mpi.cpp

#include <mpi.h>

#include <cstdlib>

#include "lockstep/base/error.h"
#include "lockstep/comm/mpi_error.h"

namespace lockstep::comm {

Environment::Environment(int* argc, char*** argv) {
  if (!initialized()) {
    int provided = 0;
    const int rc = MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided);
    if (rc != MPI_SUCCESS) LS_THROW << "MPI_Init_thread failed: " << mpi_error_string(rc);
    owns_ = true;
    if (provided < MPI_THREAD_FUNNELED) {
      MPI_Finalize();
      owns_ = false;
      LS_THROW << "the MPI library provides thread level " << provided << ", lockstep needs MPI_THREAD_FUNNELED";
    }
  }
  // Errors on MPI_COMM_WORLD itself are returned, not fatal: every
  // Communicator duplicates it and checks return codes.
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  check_mpi(MPI_Comm_rank(MPI_COMM_WORLD, &rank_), "MPI_Comm_rank");
  check_mpi(MPI_Comm_size(MPI_COMM_WORLD, &size_), "MPI_Comm_size");
}

Environment::~Environment() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (owns_ && !finalized) MPI_Finalize();
}

bool Environment::initialized() {
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  return init && !fin;
}

void Environment::abort_job(int code) {
  if (initialized()) MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);  // not reached under MPI; without it there is nothing to tear down
}

std::string Environment::library_version() {
  char buf[MPI_MAX_LIBRARY_VERSION_STRING];
  int len = 0;
  MPI_Get_library_version(buf, &len);
  std::string s(buf, size_t(len));
  while (!s.empty() && (s.back() == '\n' || s.back() == '\0')) s.pop_back();
  return s;
}

}  // namespace lockstep::comm

#endif  // LOCKSTEP_HAVE_MPI
