// Agreeing on success across ranks so that an error on one rank becomes an
// error on every rank instead of a hang in the next collective.
#pragma once

#include <exception>
#include <functional>
#include <string>
#include <vector>

#include "distckpt/comm/communicator.h"

namespace distckpt {

// Runs `step` on this rank, then all-gathers whether it succeeded. If any
// rank failed, every rank throws the same: the class of the earliest
// ErrorKind any failed rank saw, a message naming the failed ranks and what
// each saw, and Error::failures() listing them (rank, class, message, path,
// errno). An error that was itself agreed on every failed rank (a collective
// inside `step`) is rethrown unchanged. `phase` names the step in messages
// ("write data files"). If the all-gather itself fails, a rank rethrows its
// own error when it had one, else the communication error.
void run_agreed(Communicator& comm, const std::string& phase, const std::function<void()>& step);

// run_agreed and an all-gather in one collective: every rank's bytes from
// `step`, by rank, when it succeeded everywhere.
std::vector<std::string> gather_agreed(Communicator& comm, const std::string& phase,
                                       const std::function<std::string()>& step);

// run_agreed and an all-to-all in one collective: `step` returns one part per
// rank; each rank gets what every rank sent it, by rank, when the step
// succeeded everywhere.
std::vector<std::string> all_to_all_agreed(Communicator& comm, const std::string& phase,
                                           const std::function<std::vector<std::string>()>& step);

// Same agreement for an exception already caught (nullptr = success).
void agree_on_errors(Communicator& comm, const std::string& phase, std::exception_ptr local_error);

}  // namespace distckpt
