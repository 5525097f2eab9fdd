#!/usr/bin/env bash
# Creates (once) the Python virtual environment with the pinned reference packages used by the fixture
# generator and the interop tests, and prints its path on stdout (progress goes to stderr).
#
#   py=$(scripts/python-env.sh)/bin/python
#
# The venv lives in ${XDG_CACHE_HOME:-$HOME/.cache}/peft_c/venv-<hash>, where <hash> is the first 12 hex
# digits of the sha256 of tests/requirements.txt, so changing a pin gives a fresh environment and an old one
# is never reused by mistake. A marker file is written only after pip succeeded; a directory without it
# (interrupted install) is deleted and rebuilt. A lock serialises concurrent callers.
#
# Environment:
#   PYTHON                   interpreter used to create the venv (default: python3 on PATH)
#   PEFT_C_REQUIREMENTS      alternative requirements file (for testing this script)
#   PEFT_C_NO_INSTALL=1      install nothing: print the path if the environment is complete, else exit 3
#   PIP_INDEX_URL etc.       honoured by pip as usual
set -euo pipefail

repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
requirements=${PEFT_C_REQUIREMENTS:-$repo_root/tests/requirements.txt}
python=${PYTHON:-python3}

log() { printf 'python-env: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

[[ -f $requirements ]] || die "requirements file not found: $requirements"
command -v "$python" >/dev/null 2>&1 || die "no Python interpreter '$python' (set PYTHON)"

if command -v sha256sum >/dev/null 2>&1; then
    hash=$(sha256sum "$requirements" | cut -c1-12)
else
    hash=$(shasum -a 256 "$requirements" | cut -c1-12)
fi

cache_root=${XDG_CACHE_HOME:-$HOME/.cache}/peft_c
venv=$cache_root/venv-$hash
marker=$venv/.peft_c_complete

# Fast path: nothing to lock when the environment is already complete.
if [[ -f $marker && -x $venv/bin/python ]]; then
    printf '%s\n' "$venv"
    exit 0
fi

[[ ${PEFT_C_NO_INSTALL:-0} != 1 ]] || exit 3

mkdir -p "$cache_root"
lock=$cache_root/venv-$hash.lock
if command -v flock >/dev/null 2>&1; then
    exec 9>"$lock"
    log "waiting for lock $lock"
    flock 9
fi

# Another process may have finished the install while we waited for the lock.
if [[ ! -f $marker || ! -x $venv/bin/python ]]; then
    if [[ -e $venv ]]; then
        log "removing incomplete environment $venv"
        rm -rf "$venv"
    fi
    log "creating $venv with $("$python" --version 2>&1)"
    "$python" -m venv "$venv" >&2
    log "installing $requirements (this can take several minutes the first time)"
    "$venv/bin/python" -m pip install --disable-pip-version-check --no-input -r "$requirements" >&2
    cp "$requirements" "$venv/requirements.txt"
    "$venv/bin/python" -m pip freeze --disable-pip-version-check >"$venv/.peft_c_freeze.txt"
    touch "$marker"
    log "ready: $venv"
fi

printf '%s\n' "$venv"
