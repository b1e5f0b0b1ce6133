#!/usr/bin/env bash
# Put vLLM 0.26.0's own Python code, and the few small packages its engine-core boundary imports,
# into a side directory (default .vllm_contract/, git-ignored) for the CPU contract tests
# (tests/vllm_contract/). vLLM 0.26.0 pins torch 2.11 and ships CUDA builds, so it is not
# installed into the project's CPU environment: its wheel is downloaded without dependencies and
# unpacked without compiled extensions (*.so), third_party/ and vllm_flash_attn/. Nothing here
# starts an engine; the tests run vLLM's serializer, argument checks and output processing.
#
# Idempotent and cache-friendly: a stamp records the inputs; a second run with the same inputs
# returns at once, and pip's HTTP cache keeps the 290 MB wheel between fresh runs.
#
# Usage: bash tools/vllm_contract/install.sh [DEST]     (DEST defaults to $RLTRAIN_VLLM_CONTRACT_DIR
#        or .vllm_contract at the repository root)
set -euo pipefail
cd "$(dirname "$0")/../.."

VLLM_VERSION=0.26.0
here=tools/vllm_contract
dest="${1:-${RLTRAIN_VLLM_CONTRACT_DIR:-.vllm_contract}}"
stamp_want="vllm=${VLLM_VERSION} python=$(python -c 'import sys; print("%d.%d" % sys.version_info[:2])') $(sha256sum "$here/requirements.txt" "$here/install.sh" | sha256sum | cut -c1-16)"

if [[ -f "$dest/STAMP" && "$(cat "$dest/STAMP")" == "$stamp_want" ]]; then
  echo "vllm contract: $dest is current ($stamp_want)"
  exit 0
fi

start=$(date +%s)
rm -rf "$dest"
mkdir -p "$dest/wheel"
# The wheel is tagged cp38-abi3 manylinux_2_28: its Python sources serve any CPython >= 3.10.
python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --platform manylinux_2_28_x86_64 "vllm==${VLLM_VERSION}" -d "$dest/wheel"
python - "$dest" <<'EOF'
import pathlib, sys, zipfile

dest = pathlib.Path(sys.argv[1])
(wheel,) = (dest / "wheel").glob("vllm-*.whl")
kept = skipped = 0
with zipfile.ZipFile(wheel) as z:
    for info in z.infolist():
        name = info.filename
        compiled = name.endswith((".so", ".pyd")) or ".so." in name or name == "vllm/vllm-rs"
        tuned = "/configs/" in name and name.endswith(".json")  # kernel tuning tables
        if compiled or tuned or "/third_party/" in name or "/vllm_flash_attn/" in name:
            skipped += 1
            continue
        z.extract(info, dest / "site")
        kept += 1
print(f"vllm contract: unpacked {kept} files of {wheel.name} ({skipped} compiled/vendored left out)")
EOF
rm -rf "$dest/wheel"
python -m pip install -q --no-deps --only-binary=:all: --target "$dest/deps" -r "$here/requirements.txt"

# Fail here, naming the module, rather than in the tests: the project's own packages come first.
python - "$dest" <<'EOF'
import sys

sys.path += [f"{sys.argv[1]}/site", f"{sys.argv[1]}/deps"]
import vllm.entrypoints.llm, vllm.v1.engine.core, vllm.v1.engine.output_processor  # noqa: E401
import vllm.v1.serial_utils

assert vllm.__version__.startswith("0.26.0"), vllm.__version__
print(f"vllm contract: imports vllm {vllm.__version__} from {vllm.__file__}")
EOF
echo "$stamp_want" > "$dest/STAMP"
echo "vllm contract: $dest ready in $(( $(date +%s) - start )) s ($(du -sh "$dest" | cut -f1))"
