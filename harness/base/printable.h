// A message as a terminal or a log may show it: mih's messages echo values from their input (a
// name, a path, a field of a JSON file), and a value is the input's, not ours. A control
// character of one (an escape sequence, a carriage return) must not reach the terminal, a
// newline of one must not forge a line of its own ("mih check: all cases pass"), and a value of
// 300 MB must not be echoed whole (issue 53). Header-only and torch-free.
#pragma once

#include <cstddef>
#include <cstdio>
#include <string>
#include <string_view>

namespace mih {

namespace printable_detail {

// `text` with each control character (C0 but tab, DEL, and C1 as UTF-8 encodes it) as \xNN.
inline std::string escaped(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    const auto ch = static_cast<unsigned char>(text[i]);
    const bool c1 = ch == 0xc2 && i + 1 < text.size() && static_cast<unsigned char>(text[i + 1]) >= 0x80 &&
                    static_cast<unsigned char>(text[i + 1]) <= 0x9f;
    if ((ch < 0x20 && ch != '\t') || ch == 0x7f || c1) {
      char buf[16];
      std::snprintf(buf, sizeof buf, c1 ? "\\u%04x" : "\\x%02x", c1 ? static_cast<unsigned char>(text[++i]) : ch);
      out += buf;
    } else {
      out += static_cast<char>(ch);
    }
  }
  return out;
}

// The length of `text`'s first `n` bytes cut back to a UTF-8 character boundary.
inline size_t utf8_cut(std::string_view text, size_t n) {
  while (n > 0 && n < text.size() && (static_cast<unsigned char>(text[n]) & 0xC0) == 0x80) --n;
  return n;
}

}  // namespace printable_detail

/// The longest line printable_message() keeps whole, in bytes; a longer one keeps its first
/// and last kPrintableKeep bytes.
inline constexpr size_t kPrintableLine = 1024;
inline constexpr size_t kPrintableKeep = 300;

/// `message` as it may be printed: every control character but newline and tab escaped
/// ("\x1b", "\x0d"), every line after the first indented (a value's newline cannot start a
/// line a reader would take for mih's), and a line longer than kPrintableLine bytes cut to its
/// first and last kPrintableKeep bytes around "... (N bytes) ...".
inline std::string printable_message(std::string_view message) {
  std::string out;
  size_t start = 0;
  for (bool first = true;; first = false) {
    const size_t end = message.find('\n', start);
    std::string line = printable_detail::escaped(message.substr(start, end == std::string_view::npos ? end : end - start));
    if (line.size() > kPrintableLine) {
      const size_t head = printable_detail::utf8_cut(line, kPrintableKeep);
      const size_t tail = printable_detail::utf8_cut(line, line.size() - kPrintableKeep);
      line = line.substr(0, head) + " ... (" + std::to_string(line.size()) + " bytes) ... " + line.substr(tail);
    }
    if (!first) out += line.empty() || line[0] == ' ' || line[0] == '\t' ? "\n" : "\n  ";
    out += line;
    if (end == std::string_view::npos) break;
    start = end + 1;
  }
  return out;
}

}  // namespace mih
