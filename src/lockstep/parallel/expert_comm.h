// The expert-parallel transport (model::ExpertComm) over an MPI
// communicator: the EP group of a trainer rank (parallel/role_comms.h). Row
// exchanges are comm::Communicator::all_to_all_v, so they share its watchdog and
// error reporting.
#pragma once

#include <memory>

#include "lockstep/comm/communicator.h"
#include "lockstep/model/expert_parallel.h"

namespace lockstep::parallel {

// `ep` must outlive the returned object.
std::unique_ptr<model::ExpertComm> make_expert_comm(comm::Communicator& ep);

}  // namespace lockstep::parallel
