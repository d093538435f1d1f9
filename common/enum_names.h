// Name tables for user-facing enums: one table per enum, next to its definition, from which both
// its name function and its parser are derived (and the CLI's allowed values, tools/cli_util.h).
// A row per accepted spelling: the first row for a value gives its name, later rows are aliases.
//
//   inline constexpr EnumName<Kind> kKindNames[] = {{"sgd", Kind::sgd}, {"adamw", Kind::adamw}};
//   enum_name(kKindNames, Kind::sgd)                 -> "sgd"
//   parse_enum(kKindNames, "adam", "optimizer")      -> Error "unknown optimizer 'adam' (expected sgd or adamw)"
#pragma once

#include <iterator>
#include <string>
#include <string_view>
#include <utility>

#include "memplan/common/result.h"

namespace memplan {

template <class E>
struct EnumName {
  std::string_view name;
  E value;
};

// The enum type of a table (a C array, std::array, span or vector of EnumName<E>).
template <class Table>
using enum_of_table = decltype(std::begin(std::declval<const Table&>())->value);

// The value's name: the first row that holds it; "?" when no row does.
template <class Table>
constexpr std::string_view enum_name(const Table& table, enum_of_table<Table> value) {
  for (const auto& row : table) {
    if (row.value == value) return row.name;
  }
  return "?";
}

// Every name of the table in order, aliases included: "a, b or c".
template <class Table>
std::string enum_name_list(const Table& table) {
  std::string out;
  const auto n = static_cast<std::size_t>(std::distance(std::begin(table), std::end(table)));
  std::size_t i = 0;
  for (const auto& row : table) {
    if (i > 0) out += i + 1 == n ? " or " : ", ";
    out += row.name;
    ++i;
  }
  return out;
}

// The value a name stands for; an Error "unknown WHAT 'NAME' (expected a, b or c)" otherwise.
template <class Table>
Result<enum_of_table<Table>> parse_enum(const Table& table, std::string_view name, std::string_view what) {
  for (const auto& row : table) {
    if (row.name == name) return row.value;
  }
  return Error{"unknown " + std::string(what) + " '" + std::string(name) + "' (expected " + enum_name_list(table) + ")"};
}

}  // namespace memplan
