// How idle OpenMP threads wait between the CPU kernels' parallel regions. GCC's libgomp spins for
// a long time by default (300,000 iterations), which collapses a multi-threaded step when other
// processes share the cores (a spinning thread holds a core the thread it waits for needs).
// Sleeping at once (OMP_WAIT_POLICY=passive) fixes that but pays a futex wake-up per parallel
// region and gives the core away at every wait; a short spin before sleeping measured better in
// both cases (bench_model_step, 2 cores: CNN step 40.6 ms against passive's 42.6, MLP with two busy
// processes on the cores 1.0-1.1x its time alone against passive's 3.1-3.3x). libgomp reads OMP_WAIT_POLICY
// once, when it is loaded (before main, and glibc restores the environment after any earlier
// hook), so a program changes its default only by starting again with the variable set.
#pragma once

#include <string>

namespace memplan::kernels {

// Idle threads spin this many iterations (a few microseconds) before they sleep.
inline constexpr int kDefaultOpenMpSpinCount = 10000;

// Call first thing in main(argc, argv). When neither OMP_WAIT_POLICY nor GOMP_SPINCOUNT is set
// (a user's explicit choice always wins), sets GOMP_SPINCOUNT=kDefaultOpenMpSpinCount and
// re-executes the program (/proc/self/exe, same arguments). Returns when it did not re-execute:
// a variable was set already, or the exec failed (then the run keeps libgomp's long spin).
void default_to_short_openmp_spin(char** argv);

// What this process's OpenMP runtime was started with, for reports: "passive", "active" (the
// value of OMP_WAIT_POLICY), "spincount N" (GOMP_SPINCOUNT), or "default" (libgomp's long spin).
std::string openmp_wait_policy();

}  // namespace memplan::kernels
