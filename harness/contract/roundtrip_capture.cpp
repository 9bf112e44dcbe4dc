// roundtrip_capture (see roundtrip_capture.h).
#include "harness/contract/roundtrip_capture.h"

#include <nlohmann/json.hpp>

#include "harness/contract/row_schema.h"

namespace mih::contract {

RoundtripCapture roundtrip_capture(const std::string& relative, const nlohmann::json& value, const std::string& file) {
  require_schema(relative, value, file);
  RoundtripCapture out;
  out.next_step = value["next_step"].get<int64_t>();
  for (const auto& [name, t] : value["tensors"].items()) {
    out.tensors.emplace(name, TensorHash{t["sha256"].get<std::string>(), t["shape"].get<std::vector<int64_t>>()});
  }
  return out;
}

}  // namespace mih::contract
