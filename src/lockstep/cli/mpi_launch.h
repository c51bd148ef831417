// Whether this process is a rank of a job a launcher started (mpirun, srun):
// Open MPI's OMPI_COMM_WORLD_SIZE, PMIx's PMIX_RANK or PMI's PMI_SIZE/PMI_RANK
// in the environment. Commands that can run as MPI jobs (rl, sft) start MPI
// only then or when their config has a [dist] section.
#pragma once

namespace lockstep::cli {

bool launched_by_mpi();

}  // namespace lockstep::cli
