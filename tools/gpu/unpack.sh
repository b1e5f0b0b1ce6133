#!/usr/bin/env bash
# On the GPU machine: gather the bundle parts this call carried, and unpack every bundle whose
# parts are all there by now. A call carries one or more parts (tools/gpu/README.md); this
# script copies them out of the working tree into $RLTRAIN_GPU_HOME/parts/NAME, where they stay
# while the machine is kept, so a later call that carries a bundle's last part can unpack it.
#
# Usage: tools/gpu/unpack.sh [--stage-only] [CARRIED=.gpu_bundle]
#   --stage-only  copy and verify the parts carried now, extract nothing
# Environment: RLTRAIN_GPU_HOME (default /tmp/rltrain-gpu): parts/ and the extracted bundles
#              (vllm/, rest/, fallback/) go there; PYTHON (default python3).
# Prints one line per bundle on this machine: its parts, and unpacked or what is still to carry.
# Exit status: 0 (a bundle still missing parts is not an error: the steps that need it say so);
#              2 a carried part is corrupt or an archive does not decompress (each is named).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
py=${PYTHON:-python3}
home=${RLTRAIN_GPU_HOME:-/tmp/rltrain-gpu}
flags=()
if [[ ${1:-} == --stage-only ]]; then
  flags=(--stage-only)
  shift
fi
carried=${1:-.gpu_bundle}
mkdir -p "$home/parts"
exec "$py" "$here/bundle.py" gather "$carried" "$home" "${flags[@]+"${flags[@]}"}"
