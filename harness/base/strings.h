// Joining a range into one string: the lists of valid values, ranks and names every message
// prints ("dp_shard, tp, cp"). Header-only and torch-free; std::views::join_with is C++23.
#pragma once

#include <string>
#include <string_view>
#include <type_traits>

namespace mih {

/// The elements of `items` (any range) formatted by `format(element)` (returning something a
/// std::string can be appended with) and separated by `sep`: join(ranks, ", ", to_rank_name).
/// Empty for an empty range. Throws only what `format` throws.
template <class Range, class Format>
std::string join(const Range& items, std::string_view sep, Format&& format) {
  std::string out;
  bool first = true;
  for (const auto& item : items) {
    if (!first) out += sep;
    first = false;
    out += format(item);
  }
  return out;
}

/// The elements of `items` separated by `sep`: strings (std::string, std::string_view, const
/// char*) as they are, integers and floating-point numbers through std::to_string.
template <class Range>
std::string join(const Range& items, std::string_view sep = ", ") {
  return join(items, sep, [](const auto& item) -> std::string {
    using T = std::decay_t<decltype(item)>;
    if constexpr (std::is_arithmetic_v<T>) {
      return std::to_string(item);
    } else {
      return std::string(item);
    }
  });
}

}  // namespace mih
