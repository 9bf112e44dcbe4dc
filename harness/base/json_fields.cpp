// The bounds on JSON from outside: nesting depth before parsing, the input excerpt dropped from
// parse errors, and a bounded rendering of a value for messages.
#include "harness/base/json_fields.h"

namespace mih {
namespace {

constexpr size_t kShownStringBytes = 64;
constexpr int kShownLevels = 4;

// `text` as a JSON string, cut to kShownStringBytes (on a UTF-8 character boundary) with "...".
std::string string_summary(const std::string& text) {
  using Json = nlohmann::json;
  if (text.size() <= kShownStringBytes) return Json(text).dump(-1, ' ', false, Json::error_handler_t::replace);
  size_t cut = kShownStringBytes;
  while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;
  return Json(text.substr(0, cut)).dump(-1, ' ', false, Json::error_handler_t::replace) + "...";
}

// Appends `value` to *out until it holds more than `budget` characters; `level` bounds the
// recursion (kShownLevels), so a deep value costs no more stack than a shallow one.
void summarize(const nlohmann::json& value, int level, size_t budget, std::string* out) {
  if (value.is_string()) {
    *out += string_summary(value.get_ref<const std::string&>());
    return;
  }
  if (!value.is_structured()) {
    *out += value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    return;
  }
  const bool object = value.is_object();
  if (!value.empty() && level >= kShownLevels) {
    *out += object ? "{...}" : "[...]";
    return;
  }
  *out += object ? '{' : '[';
  bool first = true;
  for (auto it = value.begin(); it != value.end(); ++it) {
    if (!first) *out += ',';
    first = false;
    if (out->size() > budget) {
      *out += "...";
      break;
    }
    if (object) *out += string_summary(it.key()) + ":";
    summarize(*it, level + 1, budget, out);
  }
  *out += object ? '}' : ']';
}

}  // namespace

bool json_depth_within(std::string_view text, int max_depth) {
  int depth = 0;
  bool in_string = false, escaped = false;
  for (const char c : text) {
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > max_depth) return false;
    } else if (c == ']' || c == '}') {
      // A closing bracket with nothing open is a syntax error the parser stops at: nothing
      // after it is ever nested.
      if (--depth < 0) return true;
    }
  }
  return true;
}

std::string json_error_text(const std::exception& e) {
  std::string text = e.what();
  const size_t excerpt = text.find("; last read: ");
  if (excerpt != std::string::npos) text.erase(excerpt);
  return text;
}

bool parse_json_bounded(std::string_view text, nlohmann::json* out, std::string* problem) {
  if (!json_depth_within(text)) {
    *problem = "arrays and objects nested deeper than " + std::to_string(kMaxJsonDepth) +
               " levels (no file mih reads nests that deep)";
    return false;
  }
  try {
    *out = nlohmann::json::parse(text);
    return true;
  } catch (const nlohmann::json::exception& e) {
    *problem = json_error_text(e);
    return false;
  }
}

nlohmann::json parse_json_lenient(std::string_view text) {
  if (!json_depth_within(text)) return nlohmann::json(nlohmann::json::value_t::discarded);
  return nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
}

std::string json_summary(const nlohmann::json& value, size_t max_chars) {
  std::string out;
  summarize(value, 0, max_chars, &out);
  if (out.size() > max_chars + 8) {
    size_t cut = max_chars;
    while (cut > 0 && (static_cast<unsigned char>(out[cut]) & 0xC0) == 0x80) --cut;
    out.resize(cut);
    out += "...";
  }
  return out;
}

}  // namespace mih
