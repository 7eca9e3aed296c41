# shellcheck shell=bash
# Sourced by scripts/runtime-check and scripts/wheel-check: the directory a check writes its copy, venvs
# and runs into, decided before anything is written. Paths are compared as real paths (every symlink
# resolved): through a link, a directory inside the checkout looks like one outside it, and the check
# would copy the checkout into itself.
#   work=$(claim_work_dir NAME REPO [DIR])
# prints the real path of DIR (created when missing; it must be empty) or of a new temporary directory;
# a refusal says why on stderr, creates nothing and exits 2.

_refuse_work_dir() {
  echo "$1: $2" >&2
  exit 2
}

claim_work_dir() {
  local name=$1 repo given=${3:-} work
  repo=$(cd "$2" && pwd -P) || _refuse_work_dir "$name" "cannot resolve the checkout $2"
  # existing components resolved, missing ones kept: nothing is created to find out where DIR lies
  work=$(realpath -m -- "${given:-${TMPDIR:-/tmp}}" 2>/dev/null) ||
    _refuse_work_dir "$name" "cannot resolve ${given:-\$TMPDIR} (a symlink loop?); give a plain directory"
  local shown=$work
  [[ -z "$given" || "$given" == "$work" ]] || shown="$given (really $work)"
  case "$work/" in
    "$repo"/*) _refuse_work_dir "$name" "$shown is inside the checkout $repo; give a directory outside it" ;;
  esac
  if [[ -z "$given" ]]; then
    work=$(mktemp -d) || _refuse_work_dir "$name" "cannot create a temporary directory"
  elif [[ -e "$work" && ! -d "$work" ]]; then
    _refuse_work_dir "$name" "$shown is not a directory; give a new or empty directory"
  elif [[ -d "$work" && -n "$(ls -A -- "$work")" ]]; then
    # it writes a copy of the checkout, a venv and a run there: only into a directory of its own
    _refuse_work_dir "$name" "$shown is not empty; give a new or empty directory"
  else
    mkdir -p -- "$work" || _refuse_work_dir "$name" "cannot create $work"
  fi
  # once more as it now is: a component swapped for a link since the check must not send writes inside
  work=$(cd "$work" && pwd -P)
  case "$work/" in
    "$repo"/*) _refuse_work_dir "$name" "$work is inside the checkout $repo; give a directory outside it" ;;
  esac
  echo "$work"
}
