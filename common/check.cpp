#include "memplan/common/check.h"

namespace memplan {

void check_failed(const char* file, int line, const char* expr, const std::string& message) {
  std::ostringstream out;
  out << file << ":" << line << ": check failed: " << expr;
  if (!message.empty()) out << " (" << message << ")";
  throw InternalError(out.str());
}

}  // namespace memplan
