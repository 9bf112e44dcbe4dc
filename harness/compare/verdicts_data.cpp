// The DataLoaderState verdicts: the sample-id ledger a loader with epochs writes into every
// metrics row ("samples", "data_loader"), read across a resume's two phases.
#include <map>
#include <set>
#include <string>
#include <vector>

#include "harness/compare/verdicts.h"
#include "harness/compare/verdicts_internal.h"
#include "harness/contract/evidence_layout.h"
#include "harness/contract/metrics_row.h"

namespace mih::verdicts {

using internal::json;
using internal::rel_path;
using internal::short_json;

namespace {

// One step's row of a ledger: its samples [[epoch, index], ...] and the loader's state after it.
struct LedgerRow {
  int64_t step = 0;
  json samples;
  json state;
  std::string file;
};

// The rows of `relative` (metrics.jsonl or the save phase's), in step order, each with its
// ledger; "" or why not.
std::string ledger_rows(const CaseEvidence& ev, const std::string& relative, std::vector<LedgerRow>* out) {
  const std::string file = rel_path(ev, relative);
  const auto& lines = ev.jsonl(relative);
  contract::metrics_rows(lines, file);  // every row typed, one per step
  for (const auto& row : lines) {
    const int64_t step = row.at("step").get<int64_t>();
    if (!row.contains("samples") || !row.at("samples").is_array() || !row.contains("data_loader") ||
        !row.at("data_loader").is_object()) {
      return "the metrics row of step " + std::to_string(step) + " has no sample ledger ('samples' and " +
             "'data_loader'), so the case's loader served no sample ids: a spec whose data has epochs draws " +
             "through data::EpochLoader (open " + file + ")";
    }
    out->push_back({step, row.at("samples"), row.at("data_loader"), file});
  }
  return "";
}

// The whole run's ledger: a resume's save phase, then its load phase.
std::string run_ledger(const CaseEvidence& ev, std::vector<LedgerRow>* out) {
  if (ev.resolved_case().save_config) {
    const std::string problem = ledger_rows(ev, layout::before_save(layout::kMetrics), out);
    if (!problem.empty()) return problem;
  }
  return ledger_rows(ev, layout::kMetrics, out);
}

// A sample [epoch, index] of a ledger, or why it is not one.
std::string sample_of(const json& s, int64_t n, int64_t* epoch, int64_t* index) {
  if (!s.is_array() || s.size() != 2 || !s[0].is_number_integer() || !s[1].is_number_integer()) {
    return "a sample is [epoch, index], got " + short_json(s);
  }
  *epoch = s[0].get<int64_t>();
  *index = s[1].get<int64_t>();
  if (*epoch < 0 || *index < 0 || *index >= n) {
    return "sample " + short_json(s) + " is outside epochs >= 0 and indices [0, " + std::to_string(n) + ")";
  }
  return "";
}

}  // namespace

Verdict samples_once_per_epoch(const CaseEvidence& ev) {
  std::vector<LedgerRow> rows;
  if (const std::string problem = run_ledger(ev, &rows); !problem.empty()) return Verdict::fail(problem);
  if (rows.empty()) return Verdict::fail("the case wrote no metrics row: no ledger to examine");
  const json& first = rows.front().state;
  const json n_field = first.contains("epoch_samples") ? first.at("epoch_samples") : json();
  if (!n_field.is_number_integer() || n_field.get<int64_t>() < 1) {
    return Verdict::fail("the loader state of step " + std::to_string(rows.front().step) +
                         " names no 'epoch_samples' >= 1 (open " + rows.front().file + ")");
  }
  const int64_t n = n_field.get<int64_t>();
  // The run's every step, in order: a ledger with a step missing would hide what it served.
  const int64_t steps = ev.resolved_case().steps;
  for (int64_t k = 0; k < steps; ++k) {
    if (k >= static_cast<int64_t>(rows.size()) || rows[static_cast<size_t>(k)].step != k) {
      return Verdict::fail("the ledger of the run's " + std::to_string(steps) + " steps has no row for step " +
                           std::to_string(k) + " (open " + rows.front().file + " and " + rows.back().file + ")");
    }
  }
  std::map<int64_t, std::map<int64_t, int64_t>> seen;  // epoch -> index -> step that served it
  int64_t count = 0;
  for (const LedgerRow& row : rows) {
    for (const json& s : row.samples) {
      int64_t epoch = 0, index = 0;
      if (const std::string problem = sample_of(s, n, &epoch, &index); !problem.empty()) {
        return Verdict::fail("step " + std::to_string(row.step) + ": " + problem + " (open " + row.file + ")");
      }
      auto [it, fresh] = seen[epoch].emplace(index, row.step);
      if (!fresh) {
        return Verdict::fail("sample " + std::to_string(index) + " of epoch " + std::to_string(epoch) +
                             " was served twice: at step " + std::to_string(it->second) + " and at step " +
                             std::to_string(row.step) + " (the loader's state: " + short_json(row.state) +
                             "; open " + row.file + ")");
      }
      ++count;
    }
    // What the loader says it served after the step is what the ledger lists up to it.
    const json served = row.state.contains("samples_served") ? row.state.at("samples_served") : json();
    if (!served.is_number_integer() || served.get<int64_t>() != count) {
      return Verdict::fail("after step " + std::to_string(row.step) + " the ledger lists " + std::to_string(count) +
                           " samples and the loader says it served " + short_json(served) + " (open " + row.file + ")");
    }
  }
  if (count == 0) return Verdict::fail("the ledger of steps " + std::to_string(rows.front().step) + ".." +
                                       std::to_string(rows.back().step) + " names no sample (open " + rows.front().file + ")");
  const int64_t last = seen.rbegin()->first;
  for (int64_t e = 0; e < last; ++e) {
    const auto it = seen.find(e);
    const auto served = it == seen.end() ? 0 : static_cast<int64_t>(it->second.size());
    if (served != n) {
      return Verdict::fail("epoch " + std::to_string(e) + " ended with " + std::to_string(served) + " of its " +
                           std::to_string(n) + " samples served (the run went on to epoch " + std::to_string(last) +
                           "): samples were skipped; open " + rows.front().file + " and " + rows.back().file);
    }
  }
  return Verdict::pass("examined " + std::to_string(count) + " samples of steps " + std::to_string(rows.front().step) +
                       ".." + std::to_string(rows.back().step) + " (epochs 0.." + std::to_string(last) + " of " +
                       std::to_string(n) + " samples): none twice in an epoch, each of the " + std::to_string(last) +
                       " finished epochs served whole, " + std::to_string(seen[last].size()) + " of epoch " +
                       std::to_string(last) + " so far");
}

Verdict ledger_matches_uninterrupted_run(const CaseEvidence& twin, const CaseEvidence& ev, int64_t first_step) {
  std::vector<LedgerRow> mine, theirs;
  if (const std::string problem = ledger_rows(ev, layout::kMetrics, &mine); !problem.empty()) {
    return Verdict::fail(problem);
  }
  if (const std::string problem = ledger_rows(twin, layout::kMetrics, &theirs); !problem.empty()) {
    return Verdict::fail("the uninterrupted run: " + problem);
  }
  std::map<int64_t, const LedgerRow*> by_step;
  for (const LedgerRow& r : theirs) by_step[r.step] = &r;
  std::set<int64_t> resumed_steps;
  for (const LedgerRow& r : mine) resumed_steps.insert(r.step);
  for (const LedgerRow& t : theirs) {
    if (t.step >= first_step && !resumed_steps.count(t.step)) {
      return Verdict::fail("the uninterrupted run trained step " + std::to_string(t.step) +
                           " and the resumed run's metrics have no row for it (open " + rel_path(ev, layout::kMetrics) + ")");
    }
  }
  int64_t steps = 0, samples = 0;
  for (const LedgerRow& r : mine) {
    if (r.step < first_step) continue;
    const auto it = by_step.find(r.step);
    if (it == by_step.end()) {
      return Verdict::fail("step " + std::to_string(r.step) + " is not in the uninterrupted run's metrics (open " +
                           rel_path(twin, layout::kMetrics) + ")");
    }
    const LedgerRow& t = *it->second;
    if (r.samples != t.samples || r.state != t.state) {
      return Verdict::fail("step " + std::to_string(r.step) + " after the load served samples " +
                           short_json(r.samples) + " and left the loader at " + short_json(r.state) +
                           "; the uninterrupted run served " + short_json(t.samples) + " and stood at " +
                           short_json(t.state) + ": the loader did not continue where the checkpoint was saved (open " +
                           r.file + " and " + t.file + ")");
    }
    ++steps;
    samples += static_cast<int64_t>(r.samples.size());
  }
  if (steps == 0) return Verdict::fail("no step after the load (from step " + std::to_string(first_step) + ") to examine");
  return Verdict::pass("the " + std::to_string(samples) + " sample ids of the " + std::to_string(steps) +
                       (steps == 1 ? " step" : " steps") + " after the load, and the loader's state after each, equal the uninterrupted run's");
}

}  // namespace mih::verdicts
