// The verdicts of the optimizer's layout from the evidence files (verdicts.h): every trainable
// parameter in one group, no frozen one, no decay on a norm or a bias, the state shaped as the
// local shards. They judge mih's cases and another writer's through the same rules.
#include <fnmatch.h>

#include <algorithm>
#include <map>
#include <regex>

#include "harness/base/error.h"
#include "harness/compare/suite_reads.h"
#include "harness/compare/verdicts_internal.h"
#include "harness/contract/optimizer_layout_record.h"
#include "harness/contract/resolved_spec.h"
#include "harness/contract/structure_table.h"

namespace mih::verdicts {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

using Layouts = std::vector<std::pair<std::string, contract::OptimizerLayoutRecord>>;

// Every optimizer-layout file of the case, in the run's order: the build's, each step's, the
// load's.
Layouts layout_records(const CaseEvidence& ev) {
  std::vector<std::string> files;
  if (ev.has(layout::kOptimizerLayoutInitial)) files.push_back(layout::kOptimizerLayoutInitial);
  const std::string pattern = layout::optimizer_layout_step(0);
  const fs::path dir = fs::path(pattern).parent_path();
  const std::string name = fs::path(pattern).filename().string();
  const std::regex step_file(name.substr(0, name.rfind('0')) + "([0-9]+)" + name.substr(name.rfind('0') + 1));
  std::map<int64_t, std::string> steps;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(ev.dir() / dir, ec)) {
    std::smatch m;
    const std::string n = entry.path().filename().string();
    if (std::regex_match(n, m, step_file) && m[1].length() < 10) steps[std::stoll(m[1])] = layout::optimizer_layout_step(std::stoll(m[1]));
  }
  for (const auto& [step, file] : steps) files.push_back(file);
  if (ev.has(layout::kOptimizerLayoutAfterLoad)) files.push_back(layout::kOptimizerLayoutAfterLoad);
  Layouts out;
  for (const std::string& f : files) out.push_back({f, contract::optimizer_layout_record(f, ev.json(f), rel_path(ev, f))});
  return out;
}

struct Table {
  std::map<std::string, int> copies;  // FQN -> rows (a parameter pp stages share: one per stage)
  std::map<std::string, contract::ParameterRow> row;  // FQN -> its first row
  std::vector<contract::ParameterRow> rows;
};

Table parameter_table(const CaseEvidence& ev) {
  Table t;
  t.rows = contract::structure_parameters(ev.json(layout::kStructure), rel_path(ev, layout::kStructure));
  for (const auto& r : t.rows) {
    ++t.copies[r.fqn];
    t.row.emplace(r.fqn, r);
  }
  return t;
}

Verdict failed(const std::vector<std::string>& problems, const CaseEvidence& ev, const Layouts& layouts) {
  std::string msg = problems[0];
  for (size_t i = 1; i < std::min<size_t>(problems.size(), 5); ++i) msg += "\n  " + problems[i];
  if (problems.size() > 5) msg += "\n  and " + std::to_string(problems.size() - 5) + " more";
  return Verdict::fail(msg + "\n  (open " + rel_path(ev, layout::kStructure) + " and " +
                       rel_path(ev, layouts.front().first) + (layouts.size() > 1 ? " and the other layout files" : "") + ")");
}

std::string examined(const Layouts& layouts, const std::string& what) {
  return "examined " + what + " in " + std::to_string(layouts.size()) + " optimizer layout record(s) (" +
         layouts.front().first + (layouts.size() > 1 ? " ... " + layouts.back().first : std::string()) + ")";
}

bool matches_any(const std::vector<std::string>& globs, const contract::ParameterRow& row) {
  auto one = [&](const std::string& name) {
    return std::any_of(globs.begin(), globs.end(), [&](const std::string& g) { return ::fnmatch(g.c_str(), name.c_str(), 0) == 0; });
  };
  return one(row.fqn) || std::any_of(row.aliases.begin(), row.aliases.end(), one);
}

// A list of strings of config.resolved.json / spec.resolved.json the writer may leave out.
std::vector<std::string> optional_globs(const CaseEvidence& ev, const char* file, const char* field) {
  if (!ev.has(file)) return {};
  const json& j = ev.json(file);
  if (!j.contains(field)) return {};
  MIH_CHECK_CODE(j[field].is_array() && std::all_of(j[field].begin(), j[field].end(), [](const json& s) { return s.is_string(); }),
                 Code::kFailedPrecondition, "evidence file ", rel_path(ev, file), ": field ", field,
                 " is not a list of glob strings; fix the writer that produced it");
  return j[field].get<std::vector<std::string>>();
}

}  // namespace

std::string optimizer_layout_examinable(const CaseEvidence& ev) {
  return layout_records(ev).empty() ? "no optimizer layout record (" + std::string(layout::kOptimizerLayoutInitial) +
                                          ", " + any_step(&layout::optimizer_layout_step) + ")"
                                    : "";
}

Verdict optimizer_groups_cover_trainable(const CaseEvidence& ev) {
  const Layouts layouts = layout_records(ev);
  if (layouts.empty()) return Verdict::fail(optimizer_layout_examinable(ev));
  const Table t = parameter_table(ev);
  std::vector<std::string> problems;
  for (const auto& [file, record] : layouts) {
    std::map<std::string, std::vector<int64_t>> groups_of;
    for (const auto& g : record.groups) {
      for (const std::string& p : g.parameters) {
        if (contract::stray_entry(p)) continue;  // HoldsTheLiveShards' (tensor identity, in-process)
        if (!t.row.count(p)) problems.push_back(file + ": group " + std::to_string(g.index) + " lists '" + p + "', which is no parameter of " + layout::kStructure);
        groups_of[p].push_back(g.index);
      }
    }
    for (const auto& [fqn, copies] : t.copies) {
      const auto it = groups_of.find(fqn);
      const size_t listed = it == groups_of.end() ? 0 : it->second.size();
      if (listed == 0 && t.row.at(fqn).requires_grad) {
        problems.push_back(file + ": trainable parameter '" + fqn + "' is in no optimizer group: it gets gradients and never changes");
      } else if (listed > static_cast<size_t>(copies)) {
        problems.push_back(file + ": parameter '" + fqn + "' is listed " + std::to_string(listed) + " times (groups " +
                           json(it->second).dump() + "): it is updated more than once per step");
      }
    }
  }
  if (!problems.empty()) return failed(problems, ev, layouts);
  return Verdict::pass(examined(layouts, "the groups of " + std::to_string(t.copies.size()) + " parameters"));
}

Verdict optimizer_holds_no_frozen(const CaseEvidence& ev) {
  const Layouts layouts = layout_records(ev);
  if (layouts.empty()) return Verdict::fail(optimizer_layout_examinable(ev));
  const Table t = parameter_table(ev);
  std::vector<std::string> problems;
  int64_t frozen = 0;
  for (const auto& r : t.rows) frozen += r.requires_grad ? 0 : 1;
  for (const auto& [file, record] : layouts) {
    for (const auto& g : record.groups) {
      for (const std::string& p : g.parameters) {
        const auto row = t.row.find(p);
        if (row != t.row.end() && !row->second.requires_grad) {
          problems.push_back(file + ": frozen parameter '" + p + "' (requires_grad false) is in optimizer group " +
                             std::to_string(g.index) + ": weight decay still moves it");
        }
      }
    }
  }
  if (!problems.empty()) return failed(problems, ev, layouts);
  return Verdict::pass(examined(layouts, "the groups against " + std::to_string(frozen) + " frozen parameter(s)"));
}

Verdict no_decay_on_norms_or_biases(const CaseEvidence& ev) {
  const Layouts layouts = layout_records(ev);
  if (layouts.empty()) return Verdict::fail(optimizer_layout_examinable(ev));
  const Table t = parameter_table(ev);
  const std::vector<std::string> no_decay = optional_globs(ev, layout::kConfigResolved, "no_weight_decay");
  // Intended decay: the spec's declaration (mih's evidence), or the writer's own in its config.
  std::vector<std::string> declared = optional_globs(ev, layout::kSpecResolved, "decayed_1d");
  for (const std::string& g : optional_globs(ev, layout::kConfigResolved, "decayed_1d")) declared.push_back(g);
  std::vector<std::string> problems;
  int64_t one_dim = 0;
  for (const auto& [file, record] : layouts) {
    for (const auto& g : record.groups) {
      for (const std::string& p : g.parameters) {
        const auto row = t.row.find(p);
        if (row == t.row.end() || row->second.local_shape.size() != 1) continue;
        ++one_dim;
        // A no-decay parameter that is decayed is WeightDecayAsDeclared's (the groups against
        // the trainer's options, mih's session only).
        if (g.weight_decay > 0 && !matches_any(no_decay, row->second) && !matches_any(declared, row->second)) {
          problems.push_back(file + ": 1-D parameter '" + p + "' (a norm scale or a bias) has weight decay " +
                             number(g.weight_decay) + " in group " + std::to_string(g.index) +
                             "; its name matches no no_weight_decay pattern " + json(no_decay).dump() +
                             " (config.resolved.json) nor a declared decayed_1d " + json(declared).dump() +
                             " (spec.resolved.json, config.resolved.json)");
        }
      }
    }
  }
  if (!problems.empty()) return failed(problems, ev, layouts);
  return Verdict::pass(examined(layouts, std::to_string(one_dim) + " listings of 1-D parameters"));
}

Verdict optimizer_state_shapes_match(const CaseEvidence& ev) {
  const Layouts layouts = layout_records(ev);
  if (layouts.empty()) return Verdict::fail(optimizer_layout_examinable(ev));
  const Table t = parameter_table(ev);
  std::vector<std::string> problems;
  int64_t tensors = 0;
  for (const auto& [file, record] : layouts) {
    for (const auto& [fqn, states] : record.state) {
      const auto row = t.row.find(fqn);
      for (const auto& [name, shape] : states) {
        ++tensors;
        if (row == t.row.end()) {
          problems.push_back(file + ": state '" + name + "' of '" + fqn + "', which is no parameter of " + layout::kStructure);
        } else if (shape != row->second.local_shape) {
          problems.push_back(file + ": '" + fqn + "' " + name + " has local shape " + json(shape).dump() +
                             ", the parameter's local shard " + json(row->second.local_shape).dump() +
                             ": the update mixes elements of different positions (state not resharded)");
        }
      }
    }
  }
  if (tensors == 0) {
    return Verdict::fail("no optimizer layout record holds optimizer state ('state'): " +
                         examined(layouts, "nothing") +
                         "; record each parameter's per-element state tensors' local shapes (a run of one step "
                         "has none before its update; a sharded optimizer, its own partition's)");
  }
  if (!problems.empty()) return failed(problems, ev, layouts);
  return Verdict::pass(examined(layouts, "the local shapes of " + std::to_string(tensors) + " optimizer state tensors"));
}

}  // namespace mih::verdicts
