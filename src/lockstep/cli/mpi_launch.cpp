// launched_by_mpi (mpi_launch.h).
#include "lockstep/cli/mpi_launch.h"

#include <cstdlib>
#include <initializer_list>

namespace lockstep::cli {

bool launched_by_mpi() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_SIZE", "PMI_RANK"})
    if (std::getenv(v)) return true;
  return false;
}

}  // namespace lockstep::cli
