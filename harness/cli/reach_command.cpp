// `mih reach <root>`: which reduction paths of the runtime (harness/base/reduction_paths.h) the
// cases of a run took, from each case's cases/runtime/reduction_paths.json (what the runtime's
// collectives did, per parameter), against the table compiled into this binary.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "harness/base/error.h"
#include "harness/contract/evidence_layout.h"
#include "harness/base/json_fields.h"
#include "harness/base/reduction_paths.h"
#include "harness/cli/commands.h"
#include "harness/spec/case_matrix.h"
#include "harness/base/strings.h"

namespace mih::cli {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr const char* kPathsFile = layout::kReductionPaths;

// An evidence file's JSON; one that is not JSON is bad evidence (exit 12), never bad input.
json read_evidence(const fs::path& file) {
  try {
    return read_json_file(file);
  } catch (const Error& e) {
    MIH_THROW(Code::kFailedPrecondition, e.message(), "; it is not a file mih wrote: rerun the case");
  }
}

struct Reach {
  std::vector<std::string> cases;  // "<spec>/<case>" whose evidence took the path
  int64_t axis_size = 0;           // the largest axis it ran over
};

// The cases of the run's matrices as "<spec>/<case>" (run.json's registrations whose spec has
// evidence under the root, as `mih check` reads a root: a `--prefixes` run leaves the others
// out; each matrix resolved as this binary resolves it), and the largest world size among
// them; a spec this binary does not link counts its cases from the evidence only.
std::pair<std::set<std::string>, int> expected_cases(const fs::path& root) {
  std::set<std::string> out;
  int largest = 1;
  const json run = read_evidence(root / layout::kRunRecord);
  MIH_CHECK_CODE(run.is_object() && run.contains("registrations") && run["registrations"].is_array(),
                 Code::kFailedPrecondition, (root / layout::kRunRecord).string(),
                 " has no 'registrations' array: it is not the record of a `mih test` run (or a conformance "
                 "binary's); run the matrix with `mih test --evidence-root ", root.string(), "`");
  const std::vector<std::string> known = spec::SpecRegistry::instance().names();
  for (const auto& r : run["registrations"]) {
    MIH_CHECK_CODE(r.is_object() && r.contains("spec") && r["spec"].is_string() && r.contains("matrix") &&
                       r["matrix"].is_string(),
                   Code::kFailedPrecondition, (root / layout::kRunRecord).string(),
                   ": a registration without a 'spec' and 'matrix' string: ", r.dump().substr(0, 200));
    const std::string name = r["spec"].get<std::string>();
    std::error_code ec;
    if (std::find(known.begin(), known.end(), name) == known.end() || !fs::is_directory(root / name, ec)) continue;
    const spec::CaseMatrix m =
        with_context("reading the matrix of spec '" + name + "' from " + (root / layout::kRunRecord).string(),
                     [&] {
                       return spec::resolve_matrix_source(spec::SpecRegistry::instance().get(name),
                                                          r["matrix"].get<std::string>());
                     });
    for (const auto& c : m.cases) {
      out.insert(name + "/" + c.name);
      largest = std::max(largest, c.world_size());
      if (c.save_config) largest = std::max(largest, c.save_config->world_size());
    }
  }
  return {out, largest};
}

}  // namespace

CommandRun setup_reach(CLI::App& sub, const Invocation&) {
  struct Flags {
    std::string root;
    bool require_all = false;
  };
  auto f = std::make_shared<Flags>();
  sub.add_option("root", f->root, "run root (holds run.json and <spec>/<case>/)")->required();
  sub.add_flag("--require-all", f->require_all,
               "exit 1 when a path the run's largest case could take was taken by no case");
  return [f] {
    const fs::path root = f->root;
    std::error_code ec;
    MIH_CHECK_CODE(fs::is_directory(root, ec), Code::kFailedPrecondition, "mih reach: ", root.string(),
                   " is not a directory; give the evidence root of a run (`mih test --evidence-root DIR`)");
    auto [expected, largest] = expected_cases(root);
    // What each case's runtime recorded.
    std::map<std::string, Reach> reached;
    std::set<std::string> seen;
    for (const auto& spec_dir : fs::directory_iterator(root, ec)) {
      std::error_code entry_ec;
      if (!spec_dir.is_directory(entry_ec)) continue;
      for (const auto& case_dir : fs::directory_iterator(spec_dir.path(), entry_ec)) {
        const fs::path file = case_dir.path() / kPathsFile;
        std::error_code file_ec;
        if (!fs::is_regular_file(file, file_ec)) continue;
        const std::string id = spec_dir.path().filename().string() + "/" + case_dir.path().filename().string();
        seen.insert(id);
        expected.insert(id);
        const json j = read_evidence(file);
        MIH_CHECK_CODE(j.is_object() && j.contains("paths") && j["paths"].is_object(), Code::kFailedPrecondition,
                       file.string(), " has no 'paths' object: not a record mih wrote; rerun the case");
        for (const auto& item : j["paths"].items()) {
          const std::string name = item.key();
          const json& p = item.value();
          // A name this binary does not know is evidence of another harness version.
          const auto& table = reduction_paths();
          MIH_CHECK_CODE(std::any_of(table.begin(), table.end(), [&](const ReductionPath& t) { return t.name == name; }),
                         Code::kFailedPrecondition, file.string(), ": reduction path '", name,
                         "' is not one of this binary's (evidence of another mih version?); rerun the case");
          MIH_CHECK_CODE(p.is_object(), Code::kFailedPrecondition, file.string(), ": path '", name,
                         "' is not an object");
          const int64_t size = json_int(p, "axis_size", 0, file.string() + " path '" + name + "'", 0);
          if (size <= 1) continue;
          Reach& r = reached[name];
          r.cases.push_back(id);
          r.axis_size = std::max(r.axis_size, size);
        }
      }
    }
    std::vector<std::string> missing;
    for (const auto& id : expected) {
      if (!seen.count(id)) missing.push_back(id);
    }
    std::vector<std::string> unreached;
    std::printf("reduction paths taken by the %zu case(s) of %s (the largest has %d rank%s):\n", seen.size(),
                root.string().c_str(), largest, largest == 1 ? "" : "s");
    for (const ReductionPath& path : reduction_paths()) {
      const std::string name(path.name);
      const ParallelConfig smallest = smallest_mesh(path);
      std::string where;
      if (auto it = reached.find(name); it != reached.end()) {
        std::sort(it->second.cases.begin(), it->second.cases.end());
        where = it->second.cases.front();
        if (it->second.cases.size() > 1) where += " and " + std::to_string(it->second.cases.size() - 1) + " more";
        where += " (" + std::string(path.axis) + " " + std::to_string(it->second.axis_size) + ")";
      } else if (smallest.world_size() > largest) {
        where = "beyond this run: needs " + std::to_string(smallest.world_size()) + " ranks (" + smallest.mesh_str() + ")";
      } else {
        unreached.push_back(name);
        where = "NOT REACHED by any case (smallest mesh: " +
                (path.axis == "micro_batches" ? std::string("micro_batches=2") : smallest.mesh_str()) + "): " +
                std::string(path.what);
      }
      std::printf("  %-30s %-14s %s\n", name.c_str(), std::string(path.op).c_str(), where.c_str());
    }
    if (!missing.empty()) {
      std::string list;
      for (size_t i = 0; i < missing.size() && i < 8; ++i) list += (i ? ", " : "") + missing[i];
      if (missing.size() > 8) list += ", ...";
      std::printf("%zu case(s) of the run's matrices have no %s: %s\n", missing.size(), kPathsFile, list.c_str());
    }
    if (unreached.empty()) {
      std::printf("every reduction path a mesh of %d ranks can take was taken\n", largest);
      return 0;
    }
    std::string names = join(unreached, ", ");
    if (!f->require_all) return 0;
    // Cases that did not run may be the ones that take the missing paths: no verdict.
    MIH_CHECK_CODE(missing.empty(), Code::kFailedPrecondition, "mih reach: ", root.string(),
                   " is not a complete run (", missing.size(), " of ", expected.size(),
                   " cases have no evidence), and no case that ran took ", names,
                   "; run the whole matrix (`mih test --evidence-root DIR`) before asking what it reaches");
    std::fprintf(stderr, "mih reach: no case of the run took %s; add a case whose mesh takes %s (the smallest meshes "
                 "are listed above)\n", names.c_str(), unreached.size() == 1 ? "it" : "them");
    return 1;
  };
}

}  // namespace mih::cli
