#include "memplan/dist/communicator.h"

#include <cstdlib>
#include <cstring>
#include <string>

#include "memplan/common/check.h"
#include "memplan/dist/mpi_communicator.h"

namespace memplan::dist {

std::int64_t element_size(ElementType type) {
  switch (type) {
    case ElementType::f32: return 4;
    case ElementType::i32: return 4;
    case ElementType::i64: return 8;
    case ElementType::u16: return 2;
  }
  return 4;
}

void check_summable(ElementType type, std::string_view backend) {
  MEMPLAN_CHECK(type != ElementType::u16, "16-bit values are summed in f32 by the kernels that exchange them, not by " << backend);
}

void SingleProcessCommunicator::reduce_scatter_sum(const void* input, void* output, std::int64_t chunk,
                                                   ElementType type) {
  if (input != output) std::memmove(output, input, static_cast<std::size_t>(chunk * element_size(type)));
}

void SingleProcessCommunicator::all_to_all(const void* input, void* output, std::int64_t chunk, ElementType type) {
  std::memmove(output, input, static_cast<std::size_t>(chunk * element_size(type)));
}

void SingleProcessCommunicator::all_gather_shards(const void* input, void* output, std::int64_t numel,
                                                  ElementType type) {
  if (input != nullptr && input != output) {
    std::memmove(output, input, static_cast<std::size_t>(numel * element_size(type)));
  }
}

Result<std::unique_ptr<Communicator>> Communicator::split(int) {
  return Error{std::string(backend()) + " communicators do not split into groups: tensor parallelism trains on CPU ranks (MPI)"};
}

Result<std::unique_ptr<Communicator>> SingleProcessCommunicator::split(int) {
  return std::unique_ptr<Communicator>(std::make_unique<SingleProcessCommunicator>());
}

int launched_world_size() {
  // Open MPI's mpirun, then the PMI variables of Slurm/MPICH-style launchers.
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE"}) {
    if (const char* v = std::getenv(name); v != nullptr && *v != '\0') {
      char* end = nullptr;
      const long n = std::strtol(v, &end, 10);
      if (end != nullptr && *end == '\0' && n > 0 && n < (1 << 20)) return static_cast<int>(n);
    }
  }
  return 0;
}

Result<std::unique_ptr<Communicator>> make_cpu_communicator() {
  if (launched_world_size() <= 1) return std::unique_ptr<Communicator>(std::make_unique<SingleProcessCommunicator>());
  auto mpi = MpiCommunicator::create();
  if (!mpi) return mpi.error();
  return std::unique_ptr<Communicator>(std::move(mpi).value());
}

}  // namespace memplan::dist
