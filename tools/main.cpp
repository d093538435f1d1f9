// memplan: plan a training step's memory before it runs, then train inside that plan.
#include <malloc.h>

#include "tools/cli_app.h"

int main(int argc, char** argv) {
  // Planning builds and drops graphs of tens of thousands of ops many times over (checkpointing
  // rewrites the step for every candidate it measures, on several threads). With glibc's
  // defaults each freed graph goes back to the kernel and the next one faults its pages in again:
  // fit --max-batch on Qwen3-30B-A3B spent a quarter of its time in page faults. Growing the heap
  // in large steps and keeping what is freed (the process is short-lived) removes that;
  // bench/fit_bench.cpp measures it.
  mallopt(M_TOP_PAD, 256 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  return memplan::tools::run_cli(argc, argv);
}
