#include "memplan/trace/pickle.h"

#include <algorithm>
#include <bit>
#include <charconv>
#include <cmath>
#include <cstring>
#include <sstream>

#include "memplan/common/splitmix64.h"

namespace memplan::trace {

std::string_view py_kind_name(PyKind kind) {
  switch (kind) {
    case PyKind::none: return "NoneType";
    case PyKind::boolean: return "bool";
    case PyKind::integer: return "int";
    case PyKind::big_integer: return "int (beyond 64 bits)";
    case PyKind::floating: return "float";
    case PyKind::string: return "str";
    case PyKind::bytes: return "bytes";
    case PyKind::list: return "list";
    case PyKind::tuple: return "tuple";
    case PyKind::dict: return "dict";
  }
  return "?";
}

namespace {

constexpr std::uint64_t kWideInt = 10;  // an int that needs all 64 bits, in wide_ints_
constexpr std::int64_t kInlineLimit = std::int64_t{1} << 59;

std::uint64_t payload(const PyValue& v) { return v.bits >> 4; }
PyValue make(std::uint64_t code, std::uint64_t value) { return PyValue{(value << 4) | code}; }

}  // namespace

PyKind PyValue::kind() const {
  const std::uint64_t code = bits & 0xF;
  return code == kWideInt ? PyKind::integer : static_cast<PyKind>(code);
}

std::int64_t PickleDocument::integer(const PyValue& v) const {
  if ((v.bits & 0xF) == kWideInt) return wide_ints_[payload(v)];
  if (v.kind() != PyKind::integer && v.kind() != PyKind::boolean) return 0;
  return static_cast<std::int64_t>(v.bits) >> 4;  // arithmetic shift keeps the sign
}

double PickleDocument::floating(const PyValue& v) const {
  return v.kind() == PyKind::floating ? floats_[payload(v)] : 0.0;
}

std::string_view PickleDocument::text(const PyValue& v) const {
  if (v.kind() != PyKind::string && v.kind() != PyKind::bytes && v.kind() != PyKind::big_integer) return {};
  return strings_[payload(v)];
}

std::span<const PyValue> PickleDocument::contents(const PyValue& v) const {
  const Container& c = containers_[payload(v)];
  if (c.spill == 0 || c.spill == kShared) return {pool_.data() + c.begin, c.size};
  return spills_[c.spill - 1];
}

std::span<const PyValue> PickleDocument::items(const PyValue& v) const {
  if (v.kind() != PyKind::list && v.kind() != PyKind::tuple) return {};
  return contents(v);
}

std::span<const PyValue> PickleDocument::entries(const PyValue& v) const {
  if (v.kind() != PyKind::dict) return {};
  return contents(v);
}

const PyValue* PickleDocument::find(const PyValue& dict, std::string_view key) const {
  const auto all = entries(dict);
  for (std::size_t i = all.size(); i >= 2; i -= 2) {
    const PyValue& k = all[i - 2];
    if (k.kind() == PyKind::string && strings_[payload(k)] == key) return &all[i - 1];
  }
  return nullptr;
}

std::string PickleDocument::describe(const PyValue& v) const {
  switch (v.kind()) {
    case PyKind::none: return "None";
    case PyKind::boolean: return integer(v) ? "True" : "False";
    case PyKind::integer: return "int " + std::to_string(integer(v));
    case PyKind::floating: {
      std::ostringstream s;
      s << "float " << floating(v);
      return s.str();
    }
    case PyKind::string: {
      const std::string& s = strings_[payload(v)];
      return "str '" + (s.size() > 40 ? s.substr(0, 40) + "..." : s) + "'";
    }
    default: return std::string(py_kind_name(v.kind()));
  }
}

namespace {

// Every opcode Python's pickle module defines, for messages that name what was refused.
std::string_view opcode_name(std::uint8_t op) {
  switch (op) {
    case '(': return "MARK";
    case '.': return "STOP";
    case '0': return "POP";
    case '1': return "POP_MARK";
    case '2': return "DUP";
    case 'F': return "FLOAT";
    case 'I': return "INT";
    case 'J': return "BININT";
    case 'K': return "BININT1";
    case 'L': return "LONG";
    case 'M': return "BININT2";
    case 'N': return "NONE";
    case 'P': return "PERSID";
    case 'Q': return "BINPERSID";
    case 'R': return "REDUCE";
    case 'S': return "STRING";
    case 'T': return "BINSTRING";
    case 'U': return "SHORT_BINSTRING";
    case 'V': return "UNICODE";
    case 'X': return "BINUNICODE";
    case 'a': return "APPEND";
    case 'b': return "BUILD";
    case 'c': return "GLOBAL";
    case 'd': return "DICT";
    case '}': return "EMPTY_DICT";
    case 'e': return "APPENDS";
    case 'g': return "GET";
    case 'h': return "BINGET";
    case 'i': return "INST";
    case 'j': return "LONG_BINGET";
    case 'l': return "LIST";
    case ']': return "EMPTY_LIST";
    case 'o': return "OBJ";
    case 'p': return "PUT";
    case 'q': return "BINPUT";
    case 'r': return "LONG_BINPUT";
    case 's': return "SETITEM";
    case 't': return "TUPLE";
    case ')': return "EMPTY_TUPLE";
    case 'u': return "SETITEMS";
    case 'G': return "BINFLOAT";
    case 0x80: return "PROTO";
    case 0x81: return "NEWOBJ";
    case 0x82: return "EXT1";
    case 0x83: return "EXT2";
    case 0x84: return "EXT4";
    case 0x85: return "TUPLE1";
    case 0x86: return "TUPLE2";
    case 0x87: return "TUPLE3";
    case 0x88: return "NEWTRUE";
    case 0x89: return "NEWFALSE";
    case 0x8a: return "LONG1";
    case 0x8b: return "LONG4";
    case 'B': return "BINBYTES";
    case 'C': return "SHORT_BINBYTES";
    case 0x8c: return "SHORT_BINUNICODE";
    case 0x8d: return "BINUNICODE8";
    case 0x8e: return "BINBYTES8";
    case 0x8f: return "EMPTY_SET";
    case 0x90: return "ADDITEMS";
    case 0x91: return "FROZENSET";
    case 0x92: return "NEWOBJ_EX";
    case 0x93: return "STACK_GLOBAL";
    case 0x94: return "MEMOIZE";
    case 0x95: return "FRAME";
    case 0x96: return "BYTEARRAY8";
    case 0x97: return "NEXT_BUFFER";
    case 0x98: return "READONLY_BUFFER";
    default: return {};
  }
}

bool loads_or_calls(std::uint8_t op) {
  switch (op) {
    case 'c': case 0x93: case 'R': case 'b': case 'i': case 'o': case 0x81: case 0x92:
    case 0x82: case 0x83: case 0x84: case 'P': case 'Q':
      return true;
    default:
      return false;
  }
}

}  // namespace

// The stack machine. A MARK is a position in the stack; containers are built from the values
// above it. Values are PyValue handles into the document being filled.
class PickleParser {
 public:
  PickleParser(std::string_view bytes, const PickleLimits& limits) : in_(bytes), limits_(limits) {}

  Result<PickleDocument> run() {
    while (true) {
      if (pos_ >= in_.size()) return fail("the pickle ends before its STOP opcode (truncated file?)");
      op_offset_ = pos_;
      const auto op = static_cast<std::uint8_t>(in_[pos_++]);
      if (loads_or_calls(op)) {
        return fail("opcode " + std::string(opcode_name(op)) +
                    " would import a class or call code; a memory snapshot holds only plain data (dicts, lists, "
                    "strings, numbers), so this file is refused");
      }
      if (op == '.') {
        if (stack_.empty()) return fail("STOP with an empty stack");
        doc_.root_ = stack_.back();
        return std::move(doc_);
      }
      if (Status s = step(op); !s) return s.error();
    }
  }

 private:
  Error fail(const std::string& what) const {
    return Error{"byte " + std::to_string(op_offset_) + ": " + what};
  }

  Status step(std::uint8_t op) {
    switch (op) {
      case 0x80: {  // PROTO
        std::uint64_t v = 0;
        if (!read_le(1, &v)) return truncated();
        if (v > 5) return fail("pickle protocol " + std::to_string(v) + " is newer than 5, the highest there is");
        return {};
      }
      case 0x95: {  // FRAME: a length hint; the frame's opcodes follow inline
        std::uint64_t v = 0;
        if (!read_le(8, &v)) return truncated();
        if (v > in_.size() - pos_) return fail("FRAME of " + std::to_string(v) + " bytes but only " +
                                               std::to_string(in_.size() - pos_) + " bytes follow");
        return {};
      }
      case '(': {
        if (marks_.size() >= limits_.max_marks) return fail("more than " + std::to_string(limits_.max_marks) + " nested MARKs");
        marks_.push_back(stack_.size());
        return {};
      }
      case '0':
        if (stack_.empty()) return fail("POP with an empty stack");
        stack_.pop_back();
        return {};
      case '1': {
        std::size_t mark = 0;
        if (Status s = pop_mark(&mark); !s) return s;
        stack_.resize(mark);
        return {};
      }
      case '2':
        if (stack_.empty()) return fail("DUP with an empty stack");
        return push(stack_.back());
      case 'N': return push(PyValue{});
      case 0x88: return push(boolean(true));
      case 0x89: return push(boolean(false));
      case 'K': case 'M': case 'J': {
        const int width = op == 'K' ? 1 : op == 'M' ? 2 : 4;
        std::uint64_t v = 0;
        if (!read_le(width, &v)) return truncated();
        std::int64_t value = static_cast<std::int64_t>(v);
        if (width == 4) value = static_cast<std::int32_t>(static_cast<std::uint32_t>(v));
        return push(integer(value));
      }
      case 0x8a: case 0x8b: {  // LONG1, LONG4: little-endian two's complement of n bytes
        std::uint64_t n = 0;
        if (!read_le(op == 0x8a ? 1 : 4, &n)) return truncated();
        std::string_view body;
        if (!read_bytes(n, &body)) return truncated_length(n);
        return push_long(body);
      }
      case 'I': case 'L': {  // text integers (protocol 0/1); "01"/"00" are True/False
        std::string_view line;
        if (!read_line(&line)) return truncated();
        if (op == 'I' && line == "01") return push(boolean(true));
        if (op == 'I' && line == "00") return push(boolean(false));
        if (op == 'L' && !line.empty() && line.back() == 'L') line.remove_suffix(1);
        std::int64_t value = 0;
        auto [p, ec] = std::from_chars(line.data(), line.data() + line.size(), value);
        if (ec != std::errc() || p != line.data() + line.size()) {
          return fail(std::string(opcode_name(op)) + ": '" + std::string(line.substr(0, 40)) +
                      "' is not an integer that fits in 64 bits");
        }
        return push(integer(value));
      }
      case 'F': {
        std::string_view line;
        if (!read_line(&line)) return truncated();
        double value = 0;
        auto [p, ec] = std::from_chars(line.data(), line.data() + line.size(), value);
        if (ec != std::errc() || p != line.data() + line.size()) return fail("FLOAT: '" + std::string(line.substr(0, 40)) + "' is not a number");
        return push(floating(value));
      }
      case 'G': {
        std::uint64_t bits = 0;
        if (!read_be8(&bits)) return truncated();
        return push(floating(std::bit_cast<double>(bits)));
      }
      case 'X': case 0x8c: case 0x8d: case 'B': case 'C': case 0x8e: case 0x96: case 'T': case 'U': {
        const int width = (op == 0x8c || op == 'C' || op == 'U') ? 1 : (op == 0x8d || op == 0x8e || op == 0x96) ? 8 : 4;
        std::uint64_t n = 0;
        if (!read_le(width, &n)) return truncated();
        std::string_view body;
        if (!read_bytes(n, &body)) return truncated_length(n);
        const bool is_str = op == 'X' || op == 0x8c || op == 0x8d;
        return push_string(body, is_str ? PyKind::string : PyKind::bytes);
      }
      case ']': return push(new_sequence(PyKind::list));
      case ')': return push(new_sequence(PyKind::tuple));
      case '}': return push(new_dict());
      case 'l': case 't': {
        std::size_t mark = 0;
        if (Status s = pop_mark(&mark); !s) return s;
        PyValue v = new_sequence(op == 'l' ? PyKind::list : PyKind::tuple);
        if (Status s = append_items(v, mark); !s) return s;
        return push(v);
      }
      case 0x85: case 0x86: case 0x87: {
        const std::size_t n = op - 0x84u;
        if (stack_.size() < n) return fail(std::string(opcode_name(op)) + " needs " + std::to_string(n) + " values on the stack");
        PyValue v = new_sequence(PyKind::tuple);
        if (Status s = append_items(v, stack_.size() - n); !s) return s;
        return push(v);
      }
      case 'a': {
        if (stack_.size() < 2) return fail("APPEND needs a list and a value");
        const PyValue item = stack_.back();
        stack_.pop_back();
        const PyValue list = stack_.back();
        if (list.kind() != PyKind::list) return fail("APPEND to a " + std::string(py_kind_name(list.kind())) + ", not a list");
        stack_.push_back(item);
        return add_items(list, stack_.size() - 1);
      }
      case 'e': {
        std::size_t mark = 0;
        if (Status s = pop_mark(&mark); !s) return s;
        if (mark == 0) return fail("APPENDS with no list below its MARK");
        const PyValue list = stack_[mark - 1];
        if (list.kind() != PyKind::list) return fail("APPENDS to a " + std::string(py_kind_name(list.kind())) + ", not a list");
        return append_items(list, mark);
      }
      case 'd': {
        std::size_t mark = 0;
        if (Status s = pop_mark(&mark); !s) return s;
        PyValue v = new_dict();
        if (Status s = set_items(v, mark); !s) return s;
        return push(v);
      }
      case 's': {
        if (stack_.size() < 3) return fail("SETITEM needs a dict, a key and a value");
        const std::size_t at = stack_.size() - 2;
        const PyValue dict = stack_[at - 1];
        if (dict.kind() != PyKind::dict) return fail("SETITEM on a " + std::string(py_kind_name(dict.kind())) + ", not a dict");
        return set_items(dict, at);
      }
      case 'u': {
        std::size_t mark = 0;
        if (Status s = pop_mark(&mark); !s) return s;
        if (mark == 0) return fail("SETITEMS with no dict below its MARK");
        const PyValue dict = stack_[mark - 1];
        if (dict.kind() != PyKind::dict) return fail("SETITEMS on a " + std::string(py_kind_name(dict.kind())) + ", not a dict");
        return set_items(dict, mark);
      }
      case 0x94: return memo_put(memo_.size());
      case 'q': case 'r': {
        std::uint64_t id = 0;
        if (!read_le(op == 'q' ? 1 : 4, &id)) return truncated();
        return memo_put(id);
      }
      case 'p': case 'g': {
        std::string_view line;
        if (!read_line(&line)) return truncated();
        std::uint64_t id = 0;
        auto [p, ec] = std::from_chars(line.data(), line.data() + line.size(), id);
        if (ec != std::errc() || p != line.data() + line.size()) return fail(std::string(opcode_name(op)) + ": bad memo index");
        return op == 'p' ? memo_put(id) : memo_get(id);
      }
      case 'h': case 'j': {
        std::uint64_t id = 0;
        if (!read_le(op == 'h' ? 1 : 4, &id)) return truncated();
        return memo_get(id);
      }
      default: {
        const std::string_view name = opcode_name(op);
        char hex[8];
        std::snprintf(hex, sizeof hex, "0x%02x", op);
        if (name.empty()) return fail("byte " + std::string(hex) + " is not a pickle opcode (not a pickle file?)");
        return fail("opcode " + std::string(name) + " (" + hex +
                    ") is not part of the plain-data pickles memory snapshots are made of");
      }
    }
  }

  Status truncated() const { return fail("the file ends inside an opcode's argument (truncated file?)"); }
  Status truncated_length(std::uint64_t n) const {
    return fail("a length of " + std::to_string(n) + " bytes but only " + std::to_string(in_.size() - pos_) +
                " bytes are left in the file");
  }

  bool read_le(int width, std::uint64_t* out) {
    if (in_.size() - pos_ < static_cast<std::size_t>(width)) return false;
    std::uint64_t v = 0;
    for (int i = 0; i < width; ++i) v |= std::uint64_t(static_cast<std::uint8_t>(in_[pos_ + static_cast<std::size_t>(i)])) << (8 * i);
    pos_ += static_cast<std::size_t>(width);
    *out = v;
    return true;
  }
  bool read_be8(std::uint64_t* out) {
    if (in_.size() - pos_ < 8) return false;
    std::uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v = (v << 8) | static_cast<std::uint8_t>(in_[pos_ + static_cast<std::size_t>(i)]);
    pos_ += 8;
    *out = v;
    return true;
  }
  bool read_bytes(std::uint64_t n, std::string_view* out) {
    if (n > in_.size() - pos_) return false;
    *out = in_.substr(pos_, n);
    pos_ += n;
    return true;
  }
  bool read_line(std::string_view* out) {
    const std::size_t end = in_.find('\n', pos_);
    if (end == std::string_view::npos || end - pos_ > 256) return false;  // text numbers are short
    *out = in_.substr(pos_, end - pos_);
    pos_ = end + 1;
    return true;
  }

  Status push(const PyValue& v) {
    if (stack_.size() >= limits_.max_stack) {
      return fail("more than " + std::to_string(limits_.max_stack) + " values on the stack (nesting too deep)");
    }
    stack_.push_back(v);
    return {};
  }
  static PyValue boolean(bool b) { return make(static_cast<std::uint64_t>(PyKind::boolean), b ? 1 : 0); }
  PyValue integer(std::int64_t i) {
    if (i >= -kInlineLimit && i < kInlineLimit) return make(static_cast<std::uint64_t>(PyKind::integer), static_cast<std::uint64_t>(i));
    doc_.wide_ints_.push_back(i);
    return make(kWideInt, doc_.wide_ints_.size() - 1);
  }
  PyValue floating(double d) {
    doc_.floats_.push_back(d);
    return make(static_cast<std::uint64_t>(PyKind::floating), doc_.floats_.size() - 1);
  }

  Status push_long(std::string_view body) {
    if (body.size() <= 8) {
      std::uint64_t v = 0;
      for (std::size_t i = 0; i < body.size(); ++i) v |= std::uint64_t(static_cast<std::uint8_t>(body[i])) << (8 * i);
      if (!body.empty() && body.size() < 8 && (static_cast<std::uint8_t>(body.back()) & 0x80)) {
        v |= ~std::uint64_t{0} << (8 * body.size());  // sign-extend
      }
      return push(integer(static_cast<std::int64_t>(v)));
    }
    return push_string(body, PyKind::big_integer);
  }
  Status push_string(std::string_view body, PyKind kind) {
    doc_.strings_.emplace_back(body);
    return push(make(static_cast<std::uint64_t>(kind), doc_.strings_.size() - 1));
  }
  PyValue new_container(PyKind kind) {
    doc_.containers_.push_back({doc_.pool_.size(), 0, 0});
    return make(static_cast<std::uint64_t>(kind), doc_.containers_.size() - 1);
  }
  PyValue new_sequence(PyKind kind) { return new_container(kind); }
  PyValue new_dict() { return new_container(PyKind::dict); }

  // Adds the stack's values above `from` to a container. A container's first batch goes to the
  // pool's end; later batches extend it in place while it is still last, else it moves to a
  // vector of its own. A small first batch equal to an earlier one of the same kind shares that
  // span instead (pickles repeat stack frames and dicts of the same few values many times).
  Status add_items(const PyValue& container, std::size_t from) {
    const std::size_t n = stack_.size() - from;
    if (Status s = count_values(n); !s) return s;
    auto& c = doc_.containers_[payload(container)];
    const auto first = stack_.begin() + static_cast<std::ptrdiff_t>(from);
    auto& pool = doc_.pool_;
    if (c.spill == 0 && c.size == 0) {
      c.begin = pool.size();
      pool.insert(pool.end(), first, stack_.end());
      c.size = static_cast<std::uint32_t>(n);
      share_if_repeated(c, container.kind());
    } else if (c.spill == 0 && c.begin + c.size == pool.size()) {
      pool.insert(pool.end(), first, stack_.end());
      c.size += static_cast<std::uint32_t>(n);
    } else {
      if (c.spill == 0 || c.spill == PickleDocument::kShared) {
        doc_.spills_.emplace_back(pool.begin() + static_cast<std::ptrdiff_t>(c.begin),
                                  pool.begin() + static_cast<std::ptrdiff_t>(c.begin + c.size));
        c.spill = static_cast<std::uint32_t>(doc_.spills_.size());
      }
      auto& spill = doc_.spills_[c.spill - 1];
      spill.insert(spill.end(), first, stack_.end());
      c.size += static_cast<std::uint32_t>(n);
    }
    stack_.resize(from);
    return {};
  }

  // Open addressing over container indices, hashed by kind and items.
  // Containers in the table never change their pool span again (they are marked shared).
  std::uint64_t hash_items(const PyValue* items, std::uint32_t size, PyKind kind) const {
    std::uint64_t h = splitmix64_mix(static_cast<std::uint64_t>(kind) * kSplitMix64Gamma + size);
    for (std::uint32_t i = 0; i < size; ++i) h = splitmix64_mix(h ^ items[i].bits);
    return h;
  }
  void share_if_repeated(PickleDocument::Container& c, PyKind kind) {
    if (c.size == 0 || c.size > 16) return;
    const auto index = static_cast<std::uint32_t>(&c - doc_.containers_.data());
    if (2 * (shared_count_ + 1) > shared_slots_.size()) grow_shared();
    const PyValue* items = doc_.pool_.data() + c.begin;
    const std::uint64_t h = hash_items(items, c.size, kind);
    const auto fingerprint = static_cast<std::uint32_t>(h >> 32);
    const std::size_t mask = shared_slots_.size() - 1;
    for (std::size_t slot = h & mask;; slot = (slot + 1) & mask) {
      SharedSlot& s = shared_slots_[slot];
      if (s.container == 0) {
        s = {index + 1, fingerprint};
        shared_kinds_.resize(doc_.containers_.size());
        shared_kinds_[index] = kind;
        ++shared_count_;
        c.spill = PickleDocument::kShared;  // its span is now referenced by the table
        return;
      }
      if (s.fingerprint != fingerprint) continue;
      const auto& o = doc_.containers_[s.container - 1];
      if (shared_kinds_[s.container - 1] == kind && o.size == c.size &&
          std::equal(items, items + c.size, doc_.pool_.data() + o.begin,
                     [](const PyValue& a, const PyValue& b) { return a.bits == b.bits; })) {
        doc_.pool_.resize(c.begin);
        c.begin = o.begin;
        c.spill = PickleDocument::kShared;
        return;
      }
    }
  }
  void grow_shared() {
    std::vector<SharedSlot> old = std::move(shared_slots_);
    shared_slots_.assign(std::max<std::size_t>(1024, old.size() * 2), SharedSlot{});
    const std::size_t mask = shared_slots_.size() - 1;
    for (const SharedSlot& entry : old) {
      if (entry.container == 0) continue;
      const auto& o = doc_.containers_[entry.container - 1];
      std::size_t slot = hash_items(doc_.pool_.data() + o.begin, o.size, shared_kinds_[entry.container - 1]) & mask;
      while (shared_slots_[slot].container != 0) slot = (slot + 1) & mask;
      shared_slots_[slot] = entry;
    }
  }

  Status pop_mark(std::size_t* mark) {
    if (marks_.empty()) return fail(std::string(opcode_name(static_cast<std::uint8_t>(in_[op_offset_]))) + " without a MARK");
    *mark = marks_.back();
    marks_.pop_back();
    return {};
  }
  Status count_values(std::size_t n) {
    values_ += n;
    if (values_ > limits_.max_values) return fail("more than " + std::to_string(limits_.max_values) + " container items");
    return {};
  }
  Status append_items(const PyValue& seq, std::size_t from) { return add_items(seq, from); }
  Status set_items(const PyValue& dict, std::size_t from) {
    if ((stack_.size() - from) % 2 != 0) return fail("a dict needs key/value pairs, got an odd number of values");
    return add_items(dict, from);
  }

  Status memo_put(std::uint64_t id) {
    if (stack_.empty()) return fail("memo store with an empty stack");
    // Picklers number memo entries 0, 1, 2, ...; each store costs at least one byte of input,
    // so an index beyond the input's length can only be a hostile file.
    if (id > in_.size()) return fail("memo index " + std::to_string(id) + " is out of range");
    if (id >= memo_.size()) {
      memo_.resize(id + 1);
      memo_set_.resize(id + 1, false);
    }
    memo_[id] = stack_.back();
    memo_set_[id] = true;
    return {};
  }
  Status memo_get(std::uint64_t id) {
    if (id >= memo_.size() || !memo_set_[id]) return fail("memo index " + std::to_string(id) + " was never stored");
    return push(memo_[id]);
  }

  std::string_view in_;
  PickleLimits limits_;
  std::size_t pos_ = 0;
  std::size_t op_offset_ = 0;
  std::size_t values_ = 0;
  std::vector<PyValue> stack_;
  std::vector<std::size_t> marks_;
  std::vector<PyValue> memo_;
  std::vector<bool> memo_set_;
  struct SharedSlot {
    std::uint32_t container = 0;  // index + 1; 0 = empty
    std::uint32_t fingerprint = 0;  // the hash's high half, to skip most unequal candidates
  };
  std::vector<SharedSlot> shared_slots_;  // see share_if_repeated
  std::vector<PyKind> shared_kinds_;         // by container index, for those in the table
  std::size_t shared_count_ = 0;
  PickleDocument doc_;
};

Result<PickleDocument> parse_pickle(std::string_view bytes, const PickleLimits& limits) {
  PickleParser parser(bytes, limits);
  return parser.run();
}

}  // namespace memplan::trace
