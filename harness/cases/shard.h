// `mih test --shard i/N`: a deterministic share of a run's cases, for CI systems that fan a
// matrix out over jobs themselves. Every job runs the same binary, matrix and filter with its
// own i; each tests the cases of its share, launching the cases they compare with where they
// are needed (memo.h: once per evidence root, under the case lock, so shards sharing a root
// launch a reference once); one `mih test --verify-only` over the root then reports the whole
// matrix. A case is the unit: its tests are never split over shards. Torch-free.
#pragma once

#include <string>
#include <vector>

namespace mih::cases {

/// Share `index` (1-based) of `count`.
struct Shard {
  int index = 0;
  int count = 0;
};

/// Parses "i/N" with 1 <= i <= N <= 4096 (decimal, no sign or space).
/// Throws: mih::Error{kInvalidSpec} naming the text and the form it must have.
Shard parse_shard(const std::string& text);

/// One case to share out: "Llama/DpShard2" and its estimated cost (rank-steps, ShardItem::of).
struct ShardItem {
  std::string key;
  double cost = 1;
};

/// The share of each item (1-based, in `items`' order) among `count` shares: the items by
/// cost, largest first (ties: key ascending), each to the share with the least cost so far
/// (ties: the lowest). The same items and count give the same shares in every process.
/// Throws: mih::Error{kInvalidSpec} for count < 1.
std::vector<int> assign_shards(const std::vector<ShardItem>& items, int count);

/// Whether GoogleTest's filter selects test `name` ("Llama/MatchesOriginal.X/Reference"): a
/// positive pattern matches it (':'-separated, '*' and '?' wildcards; none: "*") and no negative
/// one (after '-') does.
bool filter_selects(const std::string& filter, const std::string& name);

/// `filter` with `excluded` patterns added to its negative part: the tests `filter` selects
/// that no excluded pattern matches (GoogleTest has no intersection; a shard removes the
/// cases of other shares).
std::string filter_excluding(const std::string& filter, const std::vector<std::string>& excluded);

}  // namespace mih::cases
