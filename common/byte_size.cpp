#include "memplan/common/byte_size.h"

#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <string>

namespace memplan {

Result<Bytes> parse_byte_size(std::string_view text) {
  const std::string original(text);
  auto error = [&](const std::string& why) {
    return Error{"bad size '" + original + "': " + why +
                 " (examples: 24GiB, 80GB, 16000MiB, 1073741824)"};
  };
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.front()))) text.remove_prefix(1);
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) text.remove_suffix(1);
  if (text.empty()) return error("it is empty");
  std::size_t number_end = 0;
  while (number_end < text.size() &&
         (std::isdigit(static_cast<unsigned char>(text[number_end])) || text[number_end] == '.' ||
          text[number_end] == '-' || text[number_end] == '+')) {
    ++number_end;
  }
  const std::string number(text.substr(0, number_end));
  std::string_view unit = text.substr(number_end);
  while (!unit.empty() && std::isspace(static_cast<unsigned char>(unit.front()))) unit.remove_prefix(1);
  if (number.empty()) return error("it does not start with a number");
  double value = 0.0;
  const auto [ptr, ec] = std::from_chars(number.data(), number.data() + number.size(), value);
  if (ec != std::errc() || ptr != number.data() + number.size()) return error("'" + number + "' is not a number");
  if (!std::isfinite(value)) return error("it is not finite");
  if (value <= 0.0) return error("it must be positive");
  std::string u;
  for (char c : unit) u.push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(c))));
  double scale = 0.0;
  if (u.empty() || u == "b") scale = 1.0;
  else if (u == "kib" || u == "k") scale = 1024.0;
  else if (u == "mib" || u == "m") scale = 1024.0 * 1024.0;
  else if (u == "gib" || u == "g") scale = 1024.0 * 1024.0 * 1024.0;
  else if (u == "tib" || u == "t") scale = 1024.0 * 1024.0 * 1024.0 * 1024.0;
  else if (u == "kb") scale = 1e3;
  else if (u == "mb") scale = 1e6;
  else if (u == "gb") scale = 1e9;
  else if (u == "tb") scale = 1e12;
  else return error("unknown unit '" + std::string(unit) + "' (use B, KiB, MiB, GiB, TiB, KB, MB, GB or TB)");
  const double bytes = value * scale;
  // 2^62 keeps every later sum of a few such sizes inside 64 bits.
  if (bytes >= 4.611686018427387904e18) return error("it is too large");
  const Bytes whole = static_cast<Bytes>(std::llround(bytes));
  if (whole < 1) return error("it is less than one byte");
  if (u.empty() && number.find('.') != std::string::npos) return error("a plain byte count must be a whole number");
  return whole;
}

std::string format_bytes(Bytes bytes) {
  char buf[96];
  const double b = static_cast<double>(bytes);
  if (bytes >= (Bytes(1) << 30)) std::snprintf(buf, sizeof(buf), "%.2f GiB", b / double(1 << 30));
  else if (bytes >= (Bytes(1) << 20)) std::snprintf(buf, sizeof(buf), "%.2f MiB", b / double(1 << 20));
  else if (bytes >= 1024) std::snprintf(buf, sizeof(buf), "%.2f KiB", b / 1024.0);
  else std::snprintf(buf, sizeof(buf), "%lld B", static_cast<long long>(bytes));
  return buf;
}

}  // namespace memplan
