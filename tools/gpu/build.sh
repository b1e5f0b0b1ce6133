#!/usr/bin/env bash
# Build the bundle the GPU machine needs to run rltrain end to end: Ray, Hydra/OmegaConf/antlr4,
# DeepSpeed (pure Python), a trimmed vLLM 0.26.0 with what offline LLM(...) imports, and rltrain
# itself, for CPython 3.12 on manylinux x86_64; plus, apart, an older transformers/tokenizers
# pair to fall back on if vLLM 0.26 does not run with the machine's transformers 5.17. Output:
# xz tar parts of at most 40 MiB, manifest.json and SHA256SUMS in OUT/parts (tools/gpu/README.md
# says how they travel). Runs on a CPU machine with the package registry; PyTorch is not in it.
#
# Usage: tools/gpu/build.sh [--out DIR] [--part-size BYTES] [--with-moe] [--no-fallback]
#        tools/gpu/build.sh --tiny WHEEL_DIR [--out DIR] [--part-size BYTES]
#   --out        where wheels/, stage/ and parts/ go (default .gpu_bundle, gitignored)
#   --part-size  largest part in bytes (default and maximum 41943040 = 40 MiB)
#   --with-moe   keep vLLM's MoE kernels (_moe_C*: +40 MiB packed); dense models do without
#   --no-fallback  leave out the older transformers/tokenizers
#   --tiny DIR   no registry: bundle the wheels in DIR as they are (the CI test's mode)
# Environment: PYTHON (default python3) runs pip and the packer.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
py=${PYTHON:-python3}
out=.gpu_bundle
part_size=41943040
tiny=""
with_moe=0
fallback=1
while (($#)); do
  case $1 in
    --out) out=$2; shift 2 ;;
    --part-size) part_size=$2; shift 2 ;;
    --tiny) tiny=$2; shift 2 ;;
    --with-moe) with_moe=1; shift ;;
    --no-fallback) fallback=0; shift ;;
    *) echo "build.sh: unknown argument $1 (see the usage at the top of $0)" >&2; exit 2 ;;
  esac
done
start=$(date +%s)
mkdir -p "$out"
out=$(cd "$out" && pwd)
wheels=$out/wheels
stage=$out/stage
mkdir -p "$wheels"

# The GPU machine's interpreter and platform: every wheel must be a CPython 3.12 x86_64 build.
target=(--only-binary=:all: --python-version 3.12 --implementation cp --abi cp312
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64
  --platform manylinux_2_24_x86_64 --platform manylinux_2_26_x86_64
  --platform manylinux_2_27_x86_64 --platform manylinux_2_28_x86_64
  --platform manylinux_2_31_x86_64 --platform manylinux_2_5_x86_64
  --platform manylinux1_x86_64)
pip() { "$py" -m pip --disable-pip-version-check "$@"; }
install_into() {  # DIR WHEEL...: no index, no dependency resolution, no bytecode (3.11 != 3.12)
  local dir=$1; shift
  PIP_CONSTRAINT="" pip install -q --no-index --no-deps --no-compile --target "$dir" \
    "${target[@]}" "$@"
}

if [[ -n $tiny ]]; then
  mapfile -t src < <(ls "$tiny"/*.whl 2>/dev/null || true)
  if ((${#src[@]} == 0)); then
    echo "build.sh: --tiny $tiny holds no *.whl" >&2
    exit 2
  fi
  rm -rf "$stage" && mkdir -p "$stage"
  install_into "$stage/site" "${src[@]}"
  mode=tiny
else
  mode=full
  echo "== download ($(grep -c '^[a-z]' "$here/bundle.txt") pinned wheels) into $wheels"
  PIP_CONSTRAINT="" pip download -q --no-deps "${target[@]}" -d "$wheels" \
    -r "$here/bundle.txt" 2>&1 | grep -v "^WARNING: Location" || true
  echo "== build the sdist-only packages and rltrain as wheels"
  if ! ls "$wheels"/deepspeed-0.19.8-*.whl >/dev/null 2>&1; then
    # DS_BUILD_OPS=0: a pure-Python wheel; the ops JIT-compile on the GPU machine.
    DS_BUILD_OPS=0 PIP_CONSTRAINT="" pip wheel -q --no-deps --no-build-isolation \
      deepspeed==0.19.8 -w "$wheels"
  fi
  if ! ls "$wheels"/antlr4_python3_runtime-4.9.3-*.whl >/dev/null 2>&1; then
    PIP_CONSTRAINT="" pip wheel -q --no-deps antlr4-python3-runtime==4.9.3 -w "$wheels"
  fi
  rm -f "$wheels"/rltrain-*.whl
  (cd "$root" && PIP_CONSTRAINT="" pip wheel -q --no-deps --no-build-isolation . -w "$wheels")
  missing=()
  while read -r req; do
    name=${req%%==*}; ver=${req#*==}
    stem=$(echo "$name" | tr '-' '_')
    ls "$wheels"/"$stem"-"$ver"-*.whl >/dev/null 2>&1 || missing+=("$req")
  done < <(grep -o '^[A-Za-z0-9._-]*==[^ ]*' "$here/bundle.txt")
  if ((${#missing[@]})); then
    echo "build.sh: not downloaded: ${missing[*]} (see pip's output above)" >&2
    exit 1
  fi
  echo "== install into $stage/site (--no-deps --target, CPython 3.12 tags)"
  rm -rf "$stage" && mkdir -p "$stage"
  install_into "$stage/site" "$wheels"/*.whl
  if ((fallback)); then
    # vLLM 0.26.0 was built 2026-07-25; transformers 5.14.1 (2026-07-16) is the newest before
    # it, and it needs tokenizers <= 0.23.0 (the machine has 0.23.2; 0.22.2 is the newest release allowed), so both travel.
    fb=$out/fallback_wheels
    mkdir -p "$fb"
    PIP_CONSTRAINT="" pip download -q --no-deps "${target[@]}" -d "$fb" \
      transformers==5.14.1 tokenizers==0.22.2 2>&1 | grep -v "^WARNING: Location" || true
    install_into "$stage/fallback" "$fb"/transformers-5.14.1-*.whl "$fb"/tokenizers-0.22.2-*.whl
  fi
fi

echo "== trim what an H100 run does not load"
trimmed=()
trim() {  # PATH...: delete, and remember what and how much
  local p
  for p in "$@"; do
    [[ -e $p ]] || continue
    trimmed+=("${p#"$stage"/} $(du -sb "$p" | cut -f1)")
    rm -rf "$p"
  done
}
s=$stage/site
shopt -s nullglob
trim "$s"/bin                                    # console scripts point at this machine's python
trim "$s"/vllm/vllm_flash_attn/_vllm_fa2_C*.so   # SM90 runs FlashAttention 3 (_vllm_fa3_C)
trim "$s"/vllm/vllm-rs                           # the Rust front end binary (serving only)
trim "$s"/vllm/third_party/fmha_sm100            # Blackwell kernels
for so in "$s"/vllm/third_party/deep_gemm/_C.cpython-*.so; do
  [[ $so == *cpython-312-* ]] || trim "$so"      # builds for the other Pythons
done
((with_moe)) || trim "$s"/vllm/_moe_C*.so        # imported only if present; dense models skip it
trim "$s"/ray/jars "$s"/ray/rllib "$s"/ray/serve "$s"/ray/llm  # Java, and libraries rltrain
                                                 # never imports (it uses ray core only)
shopt -u nullglob

build_s=$(($(date +%s) - start))
meta=$out/meta.json
"$py" - "$meta" "$mode" "$build_s" "$with_moe" "${trimmed[@]+"${trimmed[@]}"}" <<'EOF'
import json, sys, time
path, mode, secs, moe, *trimmed = sys.argv[1:]
json.dump({
    "build": {"mode": mode, "date": time.strftime("%Y-%m-%d"), "seconds_before_pack": int(secs),
              "python": "cp312", "platform": "manylinux x86_64", "vllm_moe_kernels": moe == "1"},
    "trimmed": [{"path": t.rsplit(" ", 1)[0], "bytes": int(t.rsplit(" ", 1)[1])} for t in trimmed],
}, open(path, "w"), indent=1)
EOF
echo "== pack"
"$py" "$here/bundle.py" pack "$stage" "$out/parts" --part-size "$part_size" --meta "$meta"
if [[ $mode == full ]]; then
  echo "== declared dependencies against the GPU machine (tools/gpu/check_deps.py)"
  fb_arg=()
  [[ -d $stage/fallback ]] && fb_arg=(--fallback "$stage/fallback")
  "$py" "$here/check_deps.py" "$stage/site" --json "$out/deps.json" | tail -25 || true
  echo "-- the same with the fallback transformers/tokenizers ahead of the site:"
  ((${#fb_arg[@]})) && { "$py" "$here/check_deps.py" "$stage/site" "${fb_arg[@]}" | tail -3 || true; }
fi
echo "build.sh: done in $(($(date +%s) - start)) s; carry $out/parts (tools/gpu/README.md)"
