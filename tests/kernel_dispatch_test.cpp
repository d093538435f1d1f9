// The kernel dispatch table: one kernel per (op, device, dtype), a key registered twice refused
// when the table is built, and the list of ops a device lacks.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "memplan/common/check.h"
#include "memplan/kernels/kernel.h"
#include "memplan/planner/device_profile.h"

namespace memplan::kernels {
namespace {

using graph::DType;
using graph::OpKind;

void kernel_a(const KernelCall&) {}
void kernel_b(const KernelCall&) {}

TEST(KernelDispatch, EachKeyFindsItsOwnKernel) {
  const std::vector<KernelEntries> lists = {
      {{OpKind::add, kernel_a}, {OpKind::add, kernel_b, DType::bf16}},
      {{OpKind::add, kernel_b}},
  };
  const KernelTable table(lists);
  EXPECT_EQ(table.find(OpKind::add, DeviceKind::cpu, DType::f32), &kernel_a);
  EXPECT_EQ(table.find(OpKind::add, DeviceKind::cpu, DType::bf16), &kernel_b);
  EXPECT_EQ(table.find(OpKind::add, DeviceKind::cuda, DType::f32), &kernel_b);
  EXPECT_EQ(table.find(OpKind::add, DeviceKind::cpu, DType::f16), nullptr);
  EXPECT_EQ(table.find(OpKind::mul, DeviceKind::cpu, DType::f32), nullptr);
}

TEST(KernelDispatch, ASecondRegistrationOfAKeyIsAnErrorNamingIt) {
  const std::vector<KernelEntries> lists = {{{OpKind::relu, kernel_a}, {OpKind::mul, kernel_a}, {OpKind::relu, kernel_b}}};
  try {
    const KernelTable table(lists);
    FAIL() << "a duplicate registration was accepted";
  } catch (const InternalError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("two kernels registered for op relu on cpu at fp32"), std::string::npos) << what;
  }
  // The same op at another dtype or on another device is another key.
  const std::vector<KernelEntries> distinct = {{{OpKind::relu, kernel_a}, {OpKind::relu, kernel_b, DType::f16}},
                                               {{OpKind::relu, kernel_a}}};
  EXPECT_NO_THROW(KernelTable{distinct});
}

// memplan's own registrations: every CPU kernel file's list together holds no key twice (the
// table builds); at f32 the CPU lacks only the mixed-precision updates (their gradients are
// 16-bit), and at bf16 and f16 only the f32 updates (their gradients are f32).
TEST(KernelDispatch, TheCpuLacksOnlyTheUpdatesOfTheOtherPrecision) {
  auto names = [](const std::vector<OpKind>& kinds) {
    std::vector<std::string> out;
    for (OpKind k : kinds) out.emplace_back(graph::op_name(k));
    return out;
  };
  EXPECT_EQ(names(missing_kernels(DeviceKind::cpu)),
            (std::vector<std::string>{"sgd_update_mixed", "sgd_momentum_update_mixed", "adamw_update_mixed",
                                      "adamw8bit_update_mixed"}));
  for (DType d : {DType::bf16, DType::f16}) {
    EXPECT_EQ(names(missing_kernels(DeviceKind::cpu, d)),
              (std::vector<std::string>{"sgd_update", "sgd_momentum_update", "adamw_update", "adamw8bit_update"}))
        << graph::dtype_name(d);
  }
  EXPECT_NE(find_kernel(OpKind::matmul, DeviceKind::cpu), nullptr);
}

// Each backend's ops of its own at 16 bits are the ones the planner's documented profile leaves
// out of the widening copies, so a plan made without the device (fit --device cuda) holds the
// workspace the device's executor asks for.
TEST(KernelDispatch, TheDocumentedNative16BitOpsAreTheBackendsOwn) {
  auto sorted_names = [](std::vector<OpKind> kinds) {
    std::vector<std::string> out;
    for (OpKind k : kinds) out.emplace_back(graph::op_name(k));
    std::sort(out.begin(), out.end());
    return out;
  };
  EXPECT_EQ(sorted_names(planner::documented_device_profile("cpu").value().native_16bit_ops),
            sorted_names(native_16bit_ops(DeviceKind::cpu)));
  EXPECT_EQ(sorted_names(native_16bit_ops(DeviceKind::cpu)), (std::vector<std::string>{"all_gather", "all_gather_into", "all_to_all", "cast", "embedding", "grads_finite", "pack", "softmax_cross_entropy", "to_host"}));
  if (!built_with_cuda()) {
    std::printf("this build has no CUDA kernels: the CUDA profile's list is checked by a build with the toolkit\n");
    EXPECT_TRUE(native_16bit_ops(DeviceKind::cuda).empty());
    return;
  }
  EXPECT_EQ(sorted_names(planner::documented_device_profile("cuda").value().native_16bit_ops),
            sorted_names(native_16bit_ops(DeviceKind::cuda)));
}

// Every op the CUDA backend runs at f32 it also runs at bf16 and f16 where the op's row takes
// them (natively or widened), and the mixed updates only at 16 bits.
TEST(KernelDispatch, CudaRunsAt16BitsEveryOpItRunsAtF32) {
  if (!built_with_cuda()) GTEST_SKIP() << "this build has no CUDA kernels (no toolkit at configure time)";
  for (int k = 0; k < graph::kOpKindCount; ++k) {
    const auto kind = static_cast<OpKind>(k);
    if (find_kernel(kind, DeviceKind::cuda, DType::f32) == nullptr) continue;
    for (DType d : {DType::bf16, DType::f16}) {
      if (!graph::op_info(kind).accepts.contains(d)) continue;
      EXPECT_NE(find_kernel(kind, DeviceKind::cuda, d), nullptr) << graph::op_name(kind) << " at " << graph::dtype_name(d);
    }
  }
  for (OpKind mixed : {OpKind::sgd_update_mixed, OpKind::sgd_momentum_update_mixed, OpKind::adamw_update_mixed,
                       OpKind::adamw8bit_update_mixed}) {
    EXPECT_NE(find_kernel(mixed, DeviceKind::cuda, DType::bf16), nullptr) << graph::op_name(mixed);
    EXPECT_NE(find_kernel(mixed, DeviceKind::cuda, DType::f16), nullptr) << graph::op_name(mixed);
  }
}

}  // namespace
}  // namespace memplan::kernels
