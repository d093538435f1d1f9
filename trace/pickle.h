// A whitelisting unpickler for untrusted files: it reads the plain-data subset of Python's
// pickle format (protocols 2-5, plus the protocol-0/1 integer, float and memo opcodes) that
// torch.cuda.memory._dump_snapshot writes: dicts, lists, tuples, str, bytes, int (any length),
// float, bool and None, with the memo and framing. Every opcode that would import a class or
// call something (GLOBAL, STACK_GLOBAL, REDUCE, BUILD, INST, OBJ, NEWOBJ, NEWOBJ_EX, EXT1/2/4,
// PERSID, BINPERSID) and every other opcode is refused with its name and byte offset: nothing
// in a pickle ever runs code here. Values live in one document (strings and containers by
// index), so a string or list the pickle shares through its memo is stored once.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "memplan/common/result.h"

namespace memplan::trace {

enum class PyKind : std::uint8_t { none, boolean, integer, big_integer, floating, string, bytes, list, tuple, dict };
std::string_view py_kind_name(PyKind kind);  // Python's names: "NoneType", "int", "dict", ...

// One value, 8 bytes: the kind in the low 4 bits, above them an int or bool that fits in 60
// bits, or an index into the document (strings, wide ints, floats, containers). Read it through
// the document. Two values are the same Python object when their bits are equal.
struct PyValue {
  std::uint64_t bits = 0;
  PyKind kind() const;
};

struct PickleLimits {
  std::size_t max_stack = 100'000;   // values on the unpickler's stack at once
  std::size_t max_marks = 1'000;     // open MARKs at once (containers being built)
  std::size_t max_values = 200'000'000;  // container items in the whole document
};

class PickleDocument {
 public:
  const PyValue& root() const { return root_; }

  std::int64_t integer(const PyValue& v) const;  // int and bool
  double floating(const PyValue& v) const;
  // str / bytes contents (the raw bytes of a big integer for big_integer).
  std::string_view text(const PyValue& v) const;
  std::span<const PyValue> items(const PyValue& v) const;  // list, tuple
  // A dict's keys and values, alternating: [2i] is a key, [2i + 1] its value.
  std::span<const PyValue> entries(const PyValue& v) const;
  // The value under a str key (the last one, as Python keeps), or nullptr.
  const PyValue* find(const PyValue& dict, std::string_view key) const;
  // A short rendering for error messages: the kind, or the value itself for small scalars.
  std::string describe(const PyValue& v) const;

 private:
  friend class PickleParser;
  // A container's items: a span of the pool, or (after a second batch arrives when the span is
  // no longer at the pool's end, or is shared) a vector of its own.
  struct Container {
    std::uint64_t begin = 0;
    std::uint32_t size = 0;
    std::uint32_t spill = 0;  // 0: in the pool; kShared: in the pool, shared; else spills_ index + 1
  };
  static constexpr std::uint32_t kShared = 0xFFFFFFFFu;
  std::span<const PyValue> contents(const PyValue& v) const;

  PyValue root_;
  std::vector<std::string> strings_;
  std::vector<std::int64_t> wide_ints_;
  std::vector<double> floats_;
  std::vector<Container> containers_;
  std::vector<PyValue> pool_;
  std::vector<std::vector<PyValue>> spills_;
};

// The pickled value, or an error naming the byte offset and the opcode (or the limit) at fault.
Result<PickleDocument> parse_pickle(std::string_view bytes, const PickleLimits& limits = {});

}  // namespace memplan::trace
