// The share of a sharded run (shard.h).
#include "harness/cases/shard.h"

#include <fnmatch.h>

#include <algorithm>
#include <numeric>
#include <regex>

#include "harness/base/error.h"

namespace mih::cases {

Shard parse_shard(const std::string& text) {
  static const std::regex kForm("([1-9][0-9]{0,3})/([1-9][0-9]{0,3})");
  std::smatch m;
  MIH_CHECK_CODE(text.size() < 16 && std::regex_match(text, m, kForm), Code::kInvalidSpec, "--shard '",
                 text.substr(0, 32), "': give this job's share as i/N in decimal, 1 <= i <= N <= 4096, e.g. --shard "
                 "2/4 for the second of 4 jobs");
  const Shard s{std::stoi(m[1].str()), std::stoi(m[2].str())};
  MIH_CHECK_CODE(s.count <= 4096, Code::kInvalidSpec, "--shard ", text, ": at most 4096 shares");
  MIH_CHECK_CODE(s.index <= s.count, Code::kInvalidSpec, "--shard ", text, ": share ", s.index, " of ", s.count,
                 " does not exist; i runs from 1 to N");
  return s;
}

std::vector<int> assign_shards(const std::vector<ShardItem>& items, int count) {
  MIH_CHECK_CODE(count >= 1, Code::kInvalidSpec, "a run is shared out over at least 1 share, not ", count);
  std::vector<size_t> order(items.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    if (items[a].cost != items[b].cost) return items[a].cost > items[b].cost;
    return items[a].key < items[b].key;
  });
  std::vector<double> load(static_cast<size_t>(count), 0.0);
  std::vector<int> share(items.size(), 0);
  for (const size_t i : order) {
    const size_t least = static_cast<size_t>(std::min_element(load.begin(), load.end()) - load.begin());
    load[least] += items[i].cost;
    share[i] = static_cast<int>(least) + 1;
  }
  return share;
}

bool filter_selects(const std::string& filter, const std::string& name) {
  auto any = [&](const std::string& patterns) {
    size_t start = 0;
    while (true) {
      const size_t end = patterns.find(':', start);
      const std::string p = patterns.substr(start, end == std::string::npos ? std::string::npos : end - start);
      if (!p.empty() && ::fnmatch(p.c_str(), name.c_str(), 0) == 0) return true;
      if (end == std::string::npos) return false;
      start = end + 1;
    }
  };
  const size_t dash = filter.find('-');
  const std::string positive = dash == std::string::npos ? filter : filter.substr(0, dash);
  const std::string negative = dash == std::string::npos ? "" : filter.substr(dash + 1);
  return any(positive.empty() ? "*" : positive) && !any(negative);
}

std::string filter_excluding(const std::string& filter, const std::vector<std::string>& excluded) {
  if (excluded.empty()) return filter;
  const size_t dash = filter.find('-');
  std::string positive = dash == std::string::npos ? filter : filter.substr(0, dash);
  std::string negative = dash == std::string::npos ? "" : filter.substr(dash + 1);
  if (positive.empty()) positive = "*";
  for (const auto& pattern : excluded) negative += (negative.empty() ? "" : ":") + pattern;
  return positive + "-" + negative;
}

}  // namespace mih::cases
