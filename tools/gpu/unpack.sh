#!/usr/bin/env bash
# On the GPU machine: gather the bundle's parts carried so far, and once all are there, verify,
# join and extract them. Each device call carries one part (tools/gpu/README.md); this script
# copies it out of the working tree into $RLTRAIN_GPU_HOME/parts, where it stays while the
# machine is kept, so the call that carries the last part can unpack everything.
#
# Usage: tools/gpu/unpack.sh [--stage-only] [PARTS_DIR=.gpu_bundle/parts]
#   --stage-only  copy and verify the parts carried now, list those still missing, exit 0
#                 unless a carried part is corrupt
# Environment: RLTRAIN_GPU_HOME (default /tmp/rltrain-gpu): parts/ and the extracted site/
#              and fallback/ go there; PYTHON (default python3).
# Exit status: 0 unpacked (or staged); 2 a part is missing or corrupt (each one is named).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
py=${PYTHON:-python3}
home=${RLTRAIN_GPU_HOME:-/tmp/rltrain-gpu}
stage_only=0
if [[ ${1:-} == --stage-only ]]; then
  stage_only=1
  shift
fi
carried=${1:-.gpu_bundle/parts}
mkdir -p "$home/parts"
if [[ -d $carried ]]; then
  "$py" "$here/bundle.py" stage "$carried" "$home/parts"
elif ((stage_only)); then
  echo "unpack.sh: $carried does not exist: carry .gpu_bundle/parts/manifest.json and a part" >&2
  exit 2
fi
((stage_only)) && exit 0
"$py" "$here/bundle.py" unpack "$home/parts" "$home"
