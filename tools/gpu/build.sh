#!/usr/bin/env bash
# Build the bundles the GPU machine needs beside its own packages, one per purpose, each
# listed in tools/gpu/bundles/NAME.txt: "vllm" (vLLM 0.26.0 trimmed and what offline
# LLM(...) imports: the vLLM steps), "rest" (Ray, Hydra, DeepSpeed: python -m rltrain) and
# "fallback" (an older transformers, used only if vLLM fails with the machine's). Each is installed
# for CPython 3.12 manylinux x86_64 into .gpu_bundle/stage/NAME, trimmed, and packed into
# .gpu_bundle/NAME/: xz tar parts NAME.tar.xz.000, ... of at most --part-size bytes, with
# manifest.json and SHA256SUMS. rltrain itself is not bundled: every device call carries the
# working tree. tools/gpu/README.md says which call carries which part. Runs on a CPU machine
# with the package registry; PyTorch is not in any bundle (the machine has 2.11.0).
#
# Usage: tools/gpu/build.sh [--bundle NAME]... [--out DIR] [--part-size BYTES] [--with-moe]
#        tools/gpu/build.sh --tiny NAME=WHEEL_DIR... [--out DIR] [--part-size BYTES]
#   --bundle     build this bundle (repeatable; default: vllm, rest and fallback, the plan's)
#   --out        where wheels/, stage/ and the bundles go (default .gpu_bundle, gitignored)
#   --part-size  largest part in bytes (default 28311552 = 27 MiB: the room tools/gpu/lease.py's
#                first call leaves beside the 30 MiB rest bundle, so vllm's first part goes
#                there; lease.py checks each call's total and names the bundle.py resplit
#                command that re-cuts built parts to fit)
#   --with-moe   keep vLLM's MoE kernels (_moe_C*: +40 MiB packed); dense models do without
#   --tiny NAME=DIR  no registry: bundle NAME from the wheels in DIR as they are (CI's mode;
#                repeatable)
# Environment: PYTHON (default python3) runs pip and the packer.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
py=${PYTHON:-python3}
out=.gpu_bundle
part_size=28311552
with_moe=0
bundles=()
tiny=()
while (($#)); do
  case $1 in
    --bundle) bundles+=("$2"); shift 2 ;;
    --out) out=$2; shift 2 ;;
    --part-size) part_size=$2; shift 2 ;;
    --tiny) tiny+=("$2"); shift 2 ;;
    --with-moe) with_moe=1; shift ;;
    *) echo "build.sh: unknown argument $1 (see the usage at the top of $0)" >&2; exit 2 ;;
  esac
done
if ((${#tiny[@]} == 0 && ${#bundles[@]} == 0)); then
  bundles=(vllm rest fallback)
fi
mkdir -p "$out"
out=$(cd "$out" && pwd)
wheels=$out/wheels

# The GPU machine's interpreter and platform: every wheel must be a CPython 3.12 x86_64 build.
target=(--only-binary=:all: --python-version 3.12 --implementation cp --abi cp312
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64
  --platform manylinux_2_24_x86_64 --platform manylinux_2_26_x86_64
  --platform manylinux_2_27_x86_64 --platform manylinux_2_28_x86_64
  --platform manylinux_2_31_x86_64 --platform manylinux_2_5_x86_64
  --platform manylinux1_x86_64)
pip() { "$py" -m pip --disable-pip-version-check "$@"; }
install_into() { # DIR WHEEL...: no index, no dependency resolution, no bytecode (3.11 != 3.12)
  local dir=$1
  shift
  PIP_CONSTRAINT="" pip install -q --no-index --no-deps --no-compile --target "$dir" \
    "${target[@]}" "$@"
}
pins() { grep -o '^[A-Za-z0-9._-]*==[^ ]*' "$1"; } # the name==version lines of a list
built_here() { grep '^[A-Za-z0-9._-]*==.*# built here' "$1" | grep -o '^[^ ]*' || true; }

wheel_of() { # NAME==VERSION: the downloaded or built wheel's path
  local name=${1%%==*} ver=${1#*==} stem
  stem=$(echo "$name" | tr '-' '_')
  ls "$wheels"/"$stem"-"$ver"-*.whl 2>/dev/null | head -1
}

fetch() { # LIST: download the binary wheels, build the sdist-only ones
  local list=$1 req missing=()
  mkdir -p "$wheels"
  pins "$list" | grep -v -F -x -f <(built_here "$list") >"$out/.binary.txt" || true
  PIP_CONSTRAINT="" pip download -q --no-deps "${target[@]}" -d "$wheels" \
    -r "$out/.binary.txt" 2>&1 | grep -v "^WARNING: Location" || true
  for req in $(built_here "$list"); do
    [[ -n $(wheel_of "$req") ]] && continue
    # DS_BUILD_OPS=0: DeepSpeed as a pure-Python wheel; its ops JIT-compile on the GPU machine.
    DS_BUILD_OPS=0 PIP_CONSTRAINT="" pip wheel -q --no-deps --no-build-isolation "$req" \
      -w "$wheels"
  done
  for req in $(pins "$list"); do
    [[ -n $(wheel_of "$req") ]] || missing+=("$req")
  done
  if ((${#missing[@]})); then
    echo "build.sh: not downloaded: ${missing[*]} (see pip's output above)" >&2
    exit 1
  fi
}

trimmed=()
trim() { # PATH...: delete, and remember what and how much
  local p
  for p in "$@"; do
    [[ -e $p ]] || continue
    trimmed+=("${p#"$out/stage/"} $(du -sb "$p" | cut -f1)")
    rm -rf "$p"
  done
}

trim_bundle() { # NAME SITE: what an H100 run of rltrain does not load
  local name=$1 s=$2 so
  shopt -s nullglob
  trim "$s"/bin # console scripts point at this machine's python
  if [[ $name == vllm ]]; then
    trim "$s"/vllm/vllm_flash_attn/_vllm_fa2_C*.so # SM90 runs FlashAttention 3 (_vllm_fa3_C)
    trim "$s"/vllm/vllm-rs                         # the Rust front end binary (serving only)
    trim "$s"/vllm/third_party/fmha_sm100          # Blackwell kernels
    for so in "$s"/vllm/third_party/deep_gemm/_C.cpython-*.so; do
      [[ $so == *cpython-312-* ]] || trim "$so" # builds for the other Pythons
    done
    ((with_moe)) || trim "$s"/vllm/_moe_C*.so # imported only if present; dense models skip it
  fi
  if [[ $name == rest ]]; then
    # Java, the web UI (rltrain starts Ray with include_dashboard=False) and the libraries
    # rltrain never imports (Ray core only)
    trim "$s"/ray/jars "$s"/ray/dashboard/client/build "$s"/ray/rllib "$s"/ray/serve \
      "$s"/ray/llm "$s"/ray/tune "$s"/ray/train "$s"/ray/data
  fi
  shopt -u nullglob
}

pack_bundle() { # NAME MODE START_S
  local name=$1 mode=$2 start=$3 meta=$out/stage/$name.meta.json
  "$py" - "$meta" "$name" "$mode" "$(($(date +%s) - start))" "$with_moe" \
    "${trimmed[@]+"${trimmed[@]}"}" <<'EOF'
import json, sys, time
path, name, mode, secs, moe, *trimmed = sys.argv[1:]
json.dump({
    "build": {"bundle": name, "mode": mode, "date": time.strftime("%Y-%m-%d"),
              "seconds_before_pack": int(secs), "python": "cp312",
              "platform": "manylinux x86_64", "vllm_moe_kernels": moe == "1"},
    "trimmed": [{"path": t.rsplit(" ", 1)[0], "bytes": int(t.rsplit(" ", 1)[1])} for t in trimmed],
}, open(path, "w"), indent=1)
EOF
  "$py" "$here/bundle.py" pack "$out/stage/$name/src" "$out/$name" --name "$name" \
    --part-size "$part_size" --meta "$meta"
}

build_one() { # NAME [TINY_DIR]
  local name=$1 tiny_dir=${2:-} start src list
  start=$(date +%s)
  trimmed=()
  src=$out/stage/$name/src
  rm -rf "$out/stage/$name" && mkdir -p "$src"
  if [[ -n $tiny_dir ]]; then
    mapfile -t whls < <(ls "$tiny_dir"/*.whl 2>/dev/null || true)
    if ((${#whls[@]} == 0)); then
      echo "build.sh: --tiny $name=$tiny_dir holds no *.whl" >&2
      exit 2
    fi
    install_into "$src/$name" "${whls[@]}"
    pack_bundle "$name" tiny "$start"
    return
  fi
  list=$here/bundles/$name.txt
  if [[ ! -f $list ]]; then
    echo "build.sh: no bundle $name: the bundles are" \
      "$(ls "$here/bundles"/*.txt | xargs -n1 basename | sed 's/\.txt$//' | tr '\n' ' ')" >&2
    exit 2
  fi
  echo "== $name: download ($(pins "$list" | wc -l) pinned wheels) into $wheels"
  fetch "$list"
  echo "== $name: install into $src/$name (--no-deps --target, CPython 3.12 tags)"
  mapfile -t whls < <(for req in $(pins "$list"); do wheel_of "$req"; done)
  install_into "$src/$name" "${whls[@]}"
  echo "== $name: trim what an H100 run does not load"
  trim_bundle "$name" "$src/$name"
  echo "== $name: pack"
  pack_bundle "$name" full "$start"
  echo "== $name: declared dependencies against the GPU machine (tools/gpu/check_deps.py)"
  "$py" "$here/check_deps.py" "$src/$name" --json "$out/$name.deps.json" | tail -8 || true
}

t0=$(date +%s)
for spec in "${tiny[@]+"${tiny[@]}"}"; do
  build_one "${spec%%=*}" "${spec#*=}"
done
for name in "${bundles[@]+"${bundles[@]}"}"; do
  build_one "$name"
done
echo "build.sh: done in $(($(date +%s) - t0)) s; the bundles are in $out (tools/gpu/README.md)"
