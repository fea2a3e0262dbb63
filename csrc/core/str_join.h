// Joins a range into a string: StrJoin(items, sep) streams each item, StrJoin(items, sep, fmt)
// lets fmt(std::string* out, const item&) append it. (The one string helper the core needed
// from Abseil; written here so that the package builds with a compiler and torch alone.)
#pragma once
#include <sstream>
#include <string>
#include <string_view>

namespace spmd {

template <typename Range, typename Formatter>
std::string StrJoin(const Range& items, std::string_view sep, Formatter fmt) {
  std::string out;
  bool first = true;
  for (const auto& item : items) {
    if (!first) out += sep;
    first = false;
    fmt(&out, item);
  }
  return out;
}

template <typename Range>
std::string StrJoin(const Range& items, std::string_view sep) {
  return StrJoin(items, sep, [](std::string* out, const auto& item) {
    std::ostringstream os;
    os << item;
    *out += os.str();
  });
}

}  // namespace spmd
