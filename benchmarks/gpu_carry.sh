#!/usr/bin/env bash
# Pack what `make gpu-check` needs beyond a CUDA machine's own Python into one file, for a GPU
# machine that cannot reach a package registry: DEST/site.tar.xz (about 28 MB), unpacked there by
# benchmarks/gpu_check.sh.
#
#   bash benchmarks/gpu_carry.sh [DEST]        # default DEST: .gpu_carry (make gpu-carry)
#
# Assumes the GPU machine has torch and the common scientific/web stack (numpy, pandas, pyarrow,
# aiohttp, grpcio, protobuf, msgpack, click, filelock, pyyaml, requests, psutil, packaging, attrs,
# fsspec, cloudpickle) but not Ray, so it carries Ray and the packages Ray and DeepSpeed import that
# such machines usually lack. Versions are the tested ones from constraints.txt; the wheels are
# for CPython GPU_PYTHON (default 3.12) on x86-64 Linux. DeepSpeed ships only as a source
# distribution: it is built here into a wheel with no compiled ops (it runs ZeRO-2 with torch's
# optimizers without them). Parts of Ray the checks never load (Serve, RLlib, the LLM library,
# the Java jars, the dashboard's web client, tests, type stubs) are left out.
set -euo pipefail
cd "$(dirname "$0")/.."
DEST=${1:-.gpu_carry}
GPU_PYTHON=${GPU_PYTHON:-3.12}
PY=${PY:-.venv/bin/python}   # builds the DeepSpeed wheel: needs torch importable
PACKAGES="ray jsonschema jsonschema-specifications referencing rpds-py pydantic pydantic_core
annotated-types typing-inspection typing_extensions hjson"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
pins=()
for name in $PACKAGES deepspeed; do
    pin=$(grep -i "^${name}==" constraints.txt) || { echo "gpu_carry: $name is not pinned in constraints.txt" >&2; exit 1; }
    pins+=("$pin")
done
deepspeed_pin=${pins[-1]}
unset 'pins[-1]'

python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version "$GPU_PYTHON" --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d "$work/wheels" "${pins[@]}"
DS_BUILD_OPS=0 DS_BUILD_SHM_COMM=0 "$PY" -m pip wheel --quiet --no-deps --no-build-isolation --no-cache-dir \
    -w "$work/wheels" "$deepspeed_pin"
python3 -m pip install --quiet --no-index --no-deps --no-compile --target "$work/site" \
    --python-version "$GPU_PYTHON" --implementation cp --only-binary=:all: \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    "$work"/wheels/*.whl

cd "$work/site"
rm -rf bin ray/serve ray/rllib ray/llm ray/jars ray/dashboard/client ray/tune/examples
find . -type d \( -name tests -o -name __pycache__ \) -prune -exec rm -rf {} +
find . -name '*.pyi' -delete
cd - >/dev/null

mkdir -p "$DEST"
tar -C "$work/site" -cf - . | xz -9 -T0 > "$DEST/site.tar.xz"
ls -l "$DEST/site.tar.xz"
