#!/usr/bin/env bash
# `make gpu-check` on a GPU machine without a package registry: unpack the packages carried in
# .gpu_carry/site.tar.xz (built here by `make gpu-carry`) next to the machine's own torch, then run
# the checks with its python3.
#
#   bash benchmarks/gpu_check.sh [gpu_check args...]   # results in $OUT, else ./gpu_check_results
#
# Writes gpu_check.log beside gpu_check.json and throughput.json; when a check fails it also packs
# the Ray session's logs (files under 4 MB) into ray_logs.tar.gz there. Exits with the check's code.
set -u -o pipefail
cd "$(dirname "$0")/.."
out=${OUT:-gpu_check_results}
carry=${GPU_CARRY:-.gpu_carry/site.tar.xz}
site=${GPU_SITE:-/tmp/site}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 RAY_USAGE_STATS_ENABLED=0 DO_NOT_TRACK=1
if [ -f "$carry" ]; then
    started=$SECONDS
    mkdir -p "$site"
    # Python's own tarfile where tar cannot run xz.
    tar -C "$site" -xJf "$carry" 2>/dev/null ||
        ${PYTHON:-python3} -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2], filter="tar")' "$carry" "$site" ||
        { echo "gpu_check.sh: could not unpack $carry" >&2; exit 2; }
    echo "gpu_check.sh: unpacked $carry into $site in $((SECONDS - started)) s"
    export PYTHONPATH="$site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi
command -v nvidia-smi >/dev/null && nvidia-smi -L
${PYTHON:-python3} -m benchmarks.gpu_check --out "$out" "$@" 2>&1 | tee "$out/gpu_check.log"
code=${PIPESTATUS[0]}
if [ "$code" -ne 0 ] && [ -d /tmp/ray/session_latest/logs ]; then
    (cd /tmp/ray/session_latest && find logs -type f -size -4M -print0 | tar -czf - --null -T -) > "$out/ray_logs.tar.gz"
fi
exit "$code"
