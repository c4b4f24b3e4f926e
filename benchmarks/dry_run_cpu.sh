#!/usr/bin/env bash
# A CPU dry run of a device batch script (e.g. h200_drafter40.sh): its stages in order, each in a fresh copy of the
# working tree as a device call receives it (tracked and unignored files, less MOVED_OUT, plus that call's carried
# paths), with HOME, OUT, the eaglelab cache and the wheels' site folder under DRY, so nothing outside DRY changes
# (no pip install into this machine's environment). HOME persists from stage to stage, as on a machine kept warm.
# It also checks each call's size against the device's 64 MiB (working tree and carried paths together).
#
#   DRY=/tmp/dry40 [MOVED_OUT="path ..."] [knobs of SCRIPT] bash benchmarks/dry_run_cpu.sh SCRIPT \
#       "A:.carry/m1 .carry/assets .whl" "B:.carry/m2 .carry/assets .whl" ...
#
# Each argument after SCRIPT is STAGE:CARRIED_PATHS. SCRIPT runs with DEVICE=cpu (its knob for the device) and
# whatever knobs the caller exports; a stage's output is $DRY/out_STAGE (SCRIPT's $OUT). Exits non-zero at the first
# stage whose results tarball is missing or whose log does not end in "done".
set -u
SCRIPT=${1:?usage: DRY=DIR bash benchmarks/dry_run_cpu.sh SCRIPT STAGE:CARRIED_PATHS ...}; shift
DRY=${DRY:?set DRY to an empty scratch folder}
SRC=$PWD
LIMIT=$(( 64 * 1024 * 1024 ))
mkdir -p "$DRY/home" "$DRY/cache" "$DRY/site"

tree_copy() {  # DEST: the working tree as a device call gets it, less MOVED_OUT
  rm -rf "$1"; mkdir -p "$1"
  (cd "$SRC" && git ls-files -z --cached --others --exclude-standard | while IFS= read -r -d '' f; do
    [ -e "$f" ] || continue
    for m in ${MOVED_OUT:-}; do case "$f" in "$m"|"$m"/*) continue 2;; esac; done
    printf '%s\0' "$f"
  done) | (cd "$SRC" && xargs -0 cp --parents -P -t "$1")
}

for arg in "$@"; do
  stage=${arg%%:*} carried=${arg#*:}
  repo=$DRY/repo; out=$DRY/out_$stage
  tree_copy "$repo"
  for p in $carried; do
    [ -e "$SRC/$p" ] || { echo "dry run: stage $stage carries $p, which does not exist here" >&2; exit 1; }
    mkdir -p "$repo/$(dirname "$p")"; cp -rL "$SRC/$p" "$repo/$p"
  done
  size=$(du -sb --apparent-size "$repo" | cut -f1)
  echo "== stage $stage: tree and carried paths $(( size / 1000000 )) MB of $(( LIMIT / 1000000 )) MB ($carried)"
  [ "$size" -le "$LIMIT" ] || { echo "dry run: stage $stage is over the device's 64 MiB a call" >&2; exit 1; }
  rm -rf "$out"; mkdir -p "$out"
  (cd "$repo" && STAGE=$stage OUT=$out HOME=$DRY/home EAGLELAB_CACHE=$DRY/cache SITE=$DRY/site DEVICE=cpu \
    bash "benchmarks/$SCRIPT") 2>&1 | tee "$DRY/stage_$stage.txt"
  [ -f "$out/results_$stage.tar.gz" ] || { echo "dry run: stage $stage wrote no results tarball" >&2; exit 1; }
  tar -xzf "$out/results_$stage.tar.gz" -O "r/log_$stage.txt" | grep -q "] done$" \
    || { echo "dry run: stage $stage did not reach its end (log_$stage.txt)" >&2; exit 1; }
  bad=$(tar -xzf "$out/results_$stage.tar.gz" -O "r/log_$stage.txt" | grep -E " rc=[1-9]" | grep -v "] stage rc=")
  [ -z "$bad" ] || { echo "dry run: stage $stage: a step failed: $bad" >&2; exit 1; }
  echo "== stage $stage reached its end, every step with rc=0"
done
