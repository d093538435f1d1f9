// The kernel dispatch table: one kernel per (op, device, dtype), a key registered twice refused
// when the table is built, and the list of ops a device lacks.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "memplan/common/check.h"
#include "memplan/kernels/kernel.h"

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
            (std::vector<std::string>{"sgd_update_mixed", "sgd_momentum_update_mixed", "adamw_update_mixed"}));
  for (DType d : {DType::bf16, DType::f16}) {
    EXPECT_EQ(names(missing_kernels(DeviceKind::cpu, d)), (std::vector<std::string>{"sgd_update", "sgd_momentum_update", "adamw_update"}))
        << graph::dtype_name(d);
  }
  EXPECT_NE(find_kernel(OpKind::matmul, DeviceKind::cpu), nullptr);
}

}  // namespace
}  // namespace memplan::kernels
