// Pipeline schedules and the check of an executed order (see pipeline_schedule.h).
#include "harness/base/pipeline_schedule.h"

#include <algorithm>
#include <charconv>
#include <map>
#include <set>
#include <tuple>

#include "harness/base/error.h"

namespace mih::pp {

namespace {

constexpr std::pair<ScheduleKind, std::string_view> kNames[] = {
    {ScheduleKind::kGPipe, "gpipe"},
    {ScheduleKind::k1F1B, "1f1b"},
    {ScheduleKind::kInterleaved1F1B, "interleaved_1f1b"},
};

Action forward(int stage, int micro_batch) { return {Action::Kind::kForward, stage, micro_batch}; }
Action backward(int stage, int micro_batch) { return {Action::Kind::kBackward, stage, micro_batch}; }

// Megatron-LM's interleaved order on pp rank `rank`: virtual micro-batch k (of m * vpp) is
// micro-batch (k / (pp * vpp)) * pp + k % pp through the rank's chunk (k % (pp * vpp)) / pp;
// the backwards take the chunks in reverse.
Action interleaved(const PipelineShape& s, int rank, int k, bool is_forward) {
  const int in_group = k % (s.pp * s.vpp);
  const int micro_batch = k / (s.pp * s.vpp) * s.pp + in_group % s.pp;
  int chunk = in_group / s.pp;
  if (!is_forward) chunk = s.vpp - 1 - chunk;
  const int stage = chunk * s.pp + rank;
  return is_forward ? forward(stage, micro_batch) : backward(stage, micro_batch);
}

using Key = std::tuple<Action::Kind, int, int>;
Key key_of(const Action& a) { return {a.kind, a.stage, a.micro_batch}; }

}  // namespace

std::string schedule_name(ScheduleKind kind) {
  for (const auto& [k, name] : kNames) {
    if (k == kind) return std::string(name);
  }
  MIH_INTERNAL_ASSERT(false, "unknown ScheduleKind");
  return "";
}

ScheduleKind parse_schedule(std::string_view name) {
  for (const auto& [k, n] : kNames) {
    if (n == name) return k;
  }
  MIH_THROW(Code::kInvalidSpec, "unknown pipeline schedule '", name, "': expected gpipe, 1f1b or interleaved_1f1b");
}

std::vector<int> PipelineShape::stages_of(int rank) const {
  std::vector<int> out;
  for (int chunk = 0; chunk < vpp; ++chunk) out.push_back(chunk * pp + rank);
  return out;
}

void validate(ScheduleKind kind, const PipelineShape& s) {
  MIH_CHECK(s.pp >= 1 && s.vpp >= 1 && s.micro_batches >= 1, "pipeline: pp(", s.pp, "), vpp(", s.vpp,
            ") and micro_batches(", s.micro_batches, ") must each be >= 1");
  switch (kind) {
    case ScheduleKind::kGPipe:
    case ScheduleKind::k1F1B:
      MIH_CHECK(s.vpp == 1, schedule_name(kind), " runs one stage per rank, got vpp(", s.vpp,
                "): use interleaved_1f1b for virtual stages");
      break;
    case ScheduleKind::kInterleaved1F1B:
      MIH_CHECK(s.vpp >= 2, "interleaved_1f1b needs vpp >= 2 virtual stages per rank, got vpp(", s.vpp,
                "): use 1f1b for one stage per rank");
      MIH_CHECK(s.micro_batches % s.pp == 0, "interleaved_1f1b takes micro-batches in groups of pp: micro_batches(",
                s.micro_batches, ") is not a multiple of pp(", s.pp, ")");
      break;
  }
}

std::vector<std::pair<int64_t, int64_t>> stage_layers(int64_t layers, const PipelineShape& s) {
  const int64_t stages = s.stages();
  MIH_CHECK(layers >= 1 && stages >= 1 && layers % stages == 0, "pp(", s.pp, ") x vpp(", s.vpp, ") = ", stages,
            " stages do not divide ", layers, " layers: each stage owns layers / stages contiguous decoder layers; "
            "choose pp x vpp dividing ", layers);
  std::vector<std::pair<int64_t, int64_t>> out;
  const int64_t per = layers / stages;
  for (int64_t st = 0; st < stages; ++st) out.emplace_back(st * per, (st + 1) * per);
  return out;
}

std::string Action::text() const {
  return (kind == Kind::kForward ? "F" : "B") + std::to_string(stage) + "." + std::to_string(micro_batch);
}

Action Action::parse(std::string_view text) {
  Action a;
  const auto dot = text.find('.');
  bool ok = text.size() >= 4 && (text[0] == 'F' || text[0] == 'B') && dot != std::string_view::npos;
  if (ok) {
    a.kind = text[0] == 'F' ? Kind::kForward : Kind::kBackward;
    const char* end = text.data() + text.size();
    const auto s = std::from_chars(text.data() + 1, text.data() + dot, a.stage);
    const auto m = std::from_chars(text.data() + dot + 1, end, a.micro_batch);
    ok = s.ec == std::errc() && s.ptr == text.data() + dot && m.ec == std::errc() && m.ptr == end && a.stage >= 0 &&
         a.micro_batch >= 0;
  }
  MIH_CHECK(ok, "pipeline action '", text.substr(0, 40), "' is not F<stage>.<micro_batch> or B<stage>.<micro_batch>");
  return a;
}

std::vector<std::vector<Action>> schedule(ScheduleKind kind, const PipelineShape& s) {
  validate(kind, s);
  const int m = s.micro_batches;
  std::vector<std::vector<Action>> out(static_cast<size_t>(s.pp));
  for (int r = 0; r < s.pp; ++r) {
    std::vector<Action>& order = out[static_cast<size_t>(r)];
    switch (kind) {
      case ScheduleKind::kGPipe:
        for (int i = 0; i < m; ++i) order.push_back(forward(r, i));
        for (int i = 0; i < m; ++i) order.push_back(backward(r, i));
        break;
      case ScheduleKind::k1F1B: {
        const int warmup = std::min(s.pp - r - 1, m);
        for (int i = 0; i < warmup; ++i) order.push_back(forward(r, i));
        for (int i = 0; i < m - warmup; ++i) {
          order.push_back(forward(r, warmup + i));
          order.push_back(backward(r, i));
        }
        for (int i = m - warmup; i < m; ++i) order.push_back(backward(r, i));
        break;
      }
      case ScheduleKind::kInterleaved1F1B: {
        const int total = m * s.vpp;
        const int warmup = std::min((s.pp - r - 1) * 2 + (s.vpp - 1) * s.pp, total);
        for (int k = 0; k < warmup; ++k) order.push_back(interleaved(s, r, k, true));
        for (int k = 0; k < total - warmup; ++k) {
          order.push_back(interleaved(s, r, warmup + k, true));
          order.push_back(interleaved(s, r, k, false));
        }
        for (int k = total - warmup; k < total; ++k) order.push_back(interleaved(s, r, k, false));
        break;
      }
    }
  }
  return out;
}

int max_in_flight(ScheduleKind kind, const PipelineShape& s, int rank) {
  switch (kind) {
    case ScheduleKind::kGPipe:
      return s.micro_batches * s.vpp;
    case ScheduleKind::k1F1B:
      return std::min(s.micro_batches, s.pp - rank);
    case ScheduleKind::kInterleaved1F1B:
      return std::min(s.micro_batches * s.vpp, (s.pp - rank - 1) * 2 + (s.vpp - 1) * s.pp + 1);
  }
  return 0;
}

std::vector<std::string> order_problems(ScheduleKind kind, const PipelineShape& s,
                                        const std::vector<std::vector<Action>>& executed) {
  validate(kind, s);
  std::vector<std::string> out;
  if (executed.size() != static_cast<size_t>(s.pp)) {
    out.push_back("the order names " + std::to_string(executed.size()) + " pp rank(s), the pipeline has pp(" +
                  std::to_string(s.pp) + ")");
    return out;
  }
  const int last = s.stages() - 1;
  // Where each action ran, and whether each ran exactly once.
  std::map<Key, int> runs;
  for (int r = 0; r < s.pp; ++r) {
    std::set<Key> forwards_done;
    int in_flight = 0, peak = 0;
    for (const Action& a : executed[static_cast<size_t>(r)]) {
      if (a.stage > last || a.micro_batch >= s.micro_batches) {
        out.push_back("rank " + std::to_string(r) + " ran " + a.text() + ", which is no action of " +
                      std::to_string(s.stages()) + " stages x " + std::to_string(s.micro_batches) + " micro-batches");
        continue;
      }
      if (s.rank_of(a.stage) != r) {
        out.push_back("rank " + std::to_string(r) + " ran " + a.text() + ", but stage " + std::to_string(a.stage) +
                      " lives on rank " + std::to_string(s.rank_of(a.stage)));
      }
      ++runs[key_of(a)];
      if (a.kind == Action::Kind::kForward) {
        forwards_done.insert(key_of(a));
        peak = std::max(peak, ++in_flight);
      } else {
        if (!forwards_done.count(key_of(forward(a.stage, a.micro_batch)))) {
          out.push_back("rank " + std::to_string(r) + " ran " + a.text() + " before its forward " +
                        forward(a.stage, a.micro_batch).text());
        }
        --in_flight;
      }
    }
    const int bound = max_in_flight(kind, s, r);
    if (peak > bound) {
      out.push_back("rank " + std::to_string(r) + " held the activations of " + std::to_string(peak) +
                    " forwards at once; " + schedule_name(kind) + " holds at most " + std::to_string(bound) +
                    " there (the order is not this schedule's)");
    }
  }
  bool complete = true;
  for (int st = 0; st <= last; ++st) {
    for (int mb = 0; mb < s.micro_batches; ++mb) {
      for (const Action& a : {forward(st, mb), backward(st, mb)}) {
        const auto it = runs.find(key_of(a));
        const int n = it == runs.end() ? 0 : it->second;
        if (n != 1) {
          complete = false;
          out.push_back(a.text() + (n == 0 ? " never ran" : " ran " + std::to_string(n) + " times"));
        }
      }
    }
  }
  if (!complete) return out;
  // Can the ranks run it? A receive waits for its producer, a send does not.
  std::set<Key> done;
  std::vector<size_t> next(static_cast<size_t>(s.pp), 0);
  auto ready = [&](const Action& a) {
    if (a.kind == Action::Kind::kForward) return a.stage == 0 || done.count(key_of(forward(a.stage - 1, a.micro_batch)));
    return done.count(key_of(forward(a.stage, a.micro_batch))) &&
           (a.stage == last || done.count(key_of(backward(a.stage + 1, a.micro_batch))));
  };
  for (bool progress = true; progress;) {
    progress = false;
    for (int r = 0; r < s.pp; ++r) {
      const auto& order = executed[static_cast<size_t>(r)];
      size_t& i = next[static_cast<size_t>(r)];
      while (i < order.size() && ready(order[i])) {
        done.insert(key_of(order[i++]));
        progress = true;
      }
    }
  }
  std::string stuck;
  for (int r = 0; r < s.pp; ++r) {
    const auto& order = executed[static_cast<size_t>(r)];
    const size_t i = next[static_cast<size_t>(r)];
    if (i == order.size()) continue;
    const Action& a = order[i];
    const bool own_forward = a.kind == Action::Kind::kBackward && !done.count(key_of(forward(a.stage, a.micro_batch)));
    const Action needs = a.kind == Action::Kind::kForward ? forward(a.stage - 1, a.micro_batch)
                         : own_forward                    ? forward(a.stage, a.micro_batch)
                                                          : backward(a.stage + 1, a.micro_batch);
    stuck += (stuck.empty() ? "" : "; ") + std::string("rank ") + std::to_string(r) + " waits at " + a.text() +
             " for " + needs.text();
  }
  if (!stuck.empty()) out.push_back("the ranks cannot run this order (deadlock): " + stuck);
  return out;
}

int64_t p2p_bytes_per_step(const PipelineShape& s, int64_t activation_bytes) {
  return 2 * static_cast<int64_t>(s.stages() - 1) * s.micro_batches * activation_bytes;
}

}  // namespace mih::pp
