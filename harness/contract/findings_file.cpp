// findings_file (see findings_file.h).
#include "harness/contract/findings_file.h"

#include "harness/contract/row_schema.h"

namespace mih::contract {

FindingsFile findings_file(const nlohmann::json& findings, const std::string& relative, const std::string& file) {
  require_schema(relative, findings, file);
  FindingsFile out;
  for (const auto& f : findings["findings"]) {
    out.findings.push_back({f["code"].get<std::string>(), f["phase"].get<std::string>(), f["owner"].get<std::string>(),
                            f["severity"].get<std::string>(), f["message"].get<std::string>(),
                            f["remediation"].get<std::string>(), f["facts"]});
  }
  for (const auto& [name, run] : findings["checks"].items()) {
    out.checks[name] = {run["runs"].get<int64_t>(), run["examined"].get<int64_t>(), run["unit"].get<std::string>()};
  }
  return out;
}

}  // namespace mih::contract
