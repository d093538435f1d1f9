// Renderings of a step profile (runtime/step_profile.h) for `train --profile` and
// `plan --profile`: a table per op kind and the five slowest ops; JSON with every op.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "memplan/runtime/step_profile.h"

namespace memplan::tools {

std::string profile_text(const runtime::StepProfile& profile);
nlohmann::json profile_json(const runtime::StepProfile& profile);
// The CPU thread pool's counts (kernels/cpu/parallel.h): loops it ran across threads, and those
// that stalled on a thread that was not running (other processes sharing the cores).
nlohmann::json cpu_pool_json();

}  // namespace memplan::tools
