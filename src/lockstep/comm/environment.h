// MPI initialisation guard. One Environment lives in main() for the whole run:
// it calls MPI_Init_thread (MPI_THREAD_FUNNELED: only the thread that created
// it calls MPI) unless MPI is already initialised, and MPI_Finalize when it
// goes out of scope. A program started without mpirun is a world of one rank.
// Built without MPI (-DLOCKSTEP_MPI=OFF), every world has one rank and a
// process that a launcher started as one of several ranks is refused.
#pragma once

#include <string>

namespace lockstep::comm {

// False in a build with -DLOCKSTEP_MPI=OFF (comm/no_mpi.cpp).
inline constexpr bool kBuiltWithMpi = LOCKSTEP_HAVE_MPI;

class Environment {
 public:
  // argc/argv may be null. Throws Error if MPI cannot be initialised or does
  // not provide at least MPI_THREAD_FUNNELED.
  Environment(int* argc = nullptr, char*** argv = nullptr);
  ~Environment();
  Environment(const Environment&) = delete;
  Environment& operator=(const Environment&) = delete;

  int world_rank() const { return rank_; }
  int world_size() const { return size_; }
  // "Open MPI v4.1.4, ..." as the library reports itself.
  static std::string library_version();
  static bool initialized();
  // Ends every rank of the job at once (MPI_Abort on MPI_COMM_WORLD) with
  // exit code `code`. For cli/ only: a rank that failed alone must not leave
  // the others waiting in a collective until their watchdog fires.
  [[noreturn]] static void abort_job(int code);

 private:
  bool owns_ = false;  // we called MPI_Init_thread, so we finalize
  int rank_ = 0, size_ = 1;
};

}  // namespace lockstep::comm
