#!/usr/bin/env bash
# Downloads the libtorch 2.x development headers Debian 13 (trixie) ships, plus gloo's, into a
# private folder for compile-only checks; installs nothing system-wide. Prints the include
# root. A copy of the team's shared/tools/libtorch2-headers, so CI needs nothing outside the
# repository. Usage: fetch-libtorch2-headers.sh [DIR]   (default: ~/.cache/mih/libtorch2)
set -euo pipefail
dir=${1:-${MIH_LIBTORCH2_DIR:-$HOME/.cache/mih/libtorch2}}
mkdir -p "$dir/apt/lists/partial" "$dir/apt/cache/archives/partial" "$dir/debs"
if [ ! -f "$dir/usr/include/torch/csrc/distributed/c10d/Backend.hpp" ]; then
  echo "deb http://deb.debian.org/debian trixie main" > "$dir/apt/sources.list"
  o=(-o "Dir::Etc::sourcelist=$dir/apt/sources.list" -o Dir::Etc::sourceparts=-
     -o "Dir::State::Lists=$dir/apt/lists" -o "Dir::Cache=$dir/apt/cache" -o APT::Sandbox::User=root)
  apt-get "${o[@]}" -qq update >&2
  (cd "$dir/debs" && apt-get "${o[@]}" -qq download libtorch-dev libgloo-dev >&2)
  for d in "$dir"/debs/*.deb; do dpkg -x "$d" "$dir"; done
fi
echo "$dir/usr/include"
