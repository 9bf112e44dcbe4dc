# The Python side of mih, sourced by scripts/lib/common.sh: a venv the scripts own with the
# pinned packages of python/requirements-golden.txt (torch 2.x and Hugging Face transformers,
# the original model of the reference specs' goldens, docs/golden.md). Never the system
# Python. Source it; do not run it.
#
# Where: MIH_PYENV, default ${XDG_CACHE_HOME:-~/.cache}/mih/pyenv-<first 12 hex digits of the
# requirements file's SHA-256>, so a changed pin makes a new venv beside the old one. A venv
# is complete when its marker .mih-complete holds that digest; a venv of the scripts' own (the
# marker .mih-pyenv, written before anything is installed) that is not is removed and installed
# again. A directory the scripts did not make (files and neither marker: a user's own venv or
# project) is never touched: the script stops, naming it. MIH_NO_PYPI=1 skips the install: the
# goldens then come from the builtin, and the run says so.

MIH_PY_REQUIREMENTS="$MIH_ROOT/python/requirements-golden.txt"

mih_pyenv_digest() { sha256sum "$MIH_PY_REQUIREMENTS" | cut -c1-64; }

# Whether the venv is complete for today's requirements: its marker names their digest and its
# python still finds torch and transformers (a package deleted since is installed again; found,
# not imported: a few milliseconds).
mih_pyenv_ready() {
  local dir=$1 digest=$2
  [ -x "$dir/bin/python" ] && [ -f "$dir/.mih-complete" ] && [ "$(cat "$dir/.mih-complete")" = "$digest" ] &&
    "$dir/bin/python" -c 'import importlib.util as u, sys
sys.exit(0 if u.find_spec("torch") and u.find_spec("transformers") else 1)' 2>/dev/null
}

# Whether dir holds something the scripts did not make: a file, or a directory with files and
# neither of their markers.
mih_pyenv_foreign() {
  local dir=$1
  [ -e "$dir" ] || return 1
  [ -d "$dir" ] || return 0
  { [ -f "$dir/.mih-pyenv" ] || [ -f "$dir/.mih-complete" ]; } && return 1
  [ -n "$(ls -A "$dir")" ]
}

# Installs the venv (under a lock, so two scripts never install into one folder at once).
# Returns non-zero when it cannot: no PyPI, no venv module, a failed pip.
mih_pyenv_install() {
  local dir=$1 digest=$2 base
  base=$(dirname "$dir")
  mkdir -p "$base" || return 1
  (
    flock -w 1800 9 || { mih_log "another install of $dir holds its lock for 30 minutes"; exit 1; }
    mih_pyenv_ready "$dir" "$digest" && exit 0
    rm -rf "$dir"
    mih_log "installing the pinned Python side into $dir (torch 2.8.0, transformers 4.57.1: about 4 GB" \
            "downloaded from PyPI, 6.7 GB on disk, 1.5 minutes measured on a fresh machine of ours)"
    mkdir -p "$dir" && : > "$dir/.mih-pyenv" || exit 1
    /usr/bin/python3 -m venv "$dir" || exit 1
    "$dir/bin/python" -m pip install -q --progress-bar off --no-input --disable-pip-version-check --no-cache-dir \
      --retries 2 --timeout 60 -r "$MIH_PY_REQUIREMENTS" || exit 1
    "$dir/bin/python" -c "import torch, transformers" || exit 1
    printf '%s' "$digest" > "$dir/.mih-complete"
  ) 9>"$base/.pyenv.lock"
}

# Sets MIH_TRANSFORMERS_PYTHON to the venv's python, installing the venv when missing; to ""
# (with a line saying what that means) when it cannot be had.
mih_ensure_python_env() {
  MIH_TRANSFORMERS_PYTHON=""
  if [ "${MIH_NO_PYPI:-0}" = 1 ]; then
    mih_log "MIH_NO_PYPI=1: no transformers; the reference specs' goldens come from the builtin original"
    return 0
  fi
  local digest dir
  digest=$(mih_pyenv_digest)
  dir=${MIH_PYENV:-${XDG_CACHE_HOME:-$HOME/.cache}/mih/pyenv-${digest:0:12}}
  if ! mih_pyenv_ready "$dir" "$digest" && mih_pyenv_foreign "$dir"; then
    mih_log "$dir (MIH_PYENV) is not a venv these scripts made (it holds files and no .mih-pyenv marker);"
    mih_log "nothing in it is removed. Point MIH_PYENV at a new or empty directory (or unset it), then run this again"
    exit 1
  fi
  if mih_pyenv_ready "$dir" "$digest" || mih_pyenv_install "$dir" "$digest"; then
    MIH_TRANSFORMERS_PYTHON="$dir/bin/python"
    return 0
  fi
  rm -rf "$dir"
  mih_log "could not install the Python side from PyPI into $dir (no network to PyPI?): the reference specs'"
  mih_log "goldens come from the builtin original instead, and MatchesOriginal says so; run again with PyPI"
  mih_log "reachable, or set MIH_NO_PYPI=1 to skip this attempt"
}
