// common/byte_size: budget strings users type, and every malformed one refused with a reason.
#include <gtest/gtest.h>

#include "memplan/common/byte_size.h"

namespace memplan {
namespace {

TEST(ByteSize, ParsesBinaryDecimalAndPlainSizes) {
  EXPECT_EQ(parse_byte_size("24GiB").value(), 24LL << 30);
  EXPECT_EQ(parse_byte_size("80GB").value(), 80'000'000'000LL);
  EXPECT_EQ(parse_byte_size("16000MiB").value(), 16000LL << 20);
  EXPECT_EQ(parse_byte_size("1.5 GiB").value(), 3LL << 29);
  EXPECT_EQ(parse_byte_size("4096").value(), 4096);
  EXPECT_EQ(parse_byte_size(" 12kib ").value(), 12 * 1024);
  EXPECT_EQ(parse_byte_size("2T").value(), 2LL << 40);
}

TEST(ByteSize, RefusesWhatIsNotASize) {
  const char* bad[] = {"", "0", "0GiB", "-5GiB", "nan", "NaNGiB", "inf", "12 parsecs", "GiB", "1e400",
                       "99999999999TiB", "1.5", "1..5GiB", "abc", "1GiBx"};
  for (const char* text : bad) {
    auto r = parse_byte_size(text);
    EXPECT_FALSE(r.ok()) << "'" << text << "' was accepted as " << (r.ok() ? r.value() : 0);
    if (!r.ok()) {
      EXPECT_NE(r.error().message.find("bad size"), std::string::npos);
    }
  }
}

}  // namespace
}  // namespace memplan
