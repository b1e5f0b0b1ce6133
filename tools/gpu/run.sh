#!/usr/bin/env bash
# The measurements of a GPU lease, step by step (tools/gpu/lease.py gives the calls and the
# order). Each step is time-boxed, skipped with its reason when this call lacks the bundle it
# needs or the time it is worth, and followed at once by publishing every result so far to
# $OUT (results.json from tools/gpu/collect.py, logs.tar.gz): a call cut off by the device
# tool still returns what it measured. Results of earlier calls stay in
# $RLTRAIN_GPU_HOME/results while the machine is kept, and every call returns all of them.
#
# Usage (repository root, on the GPU machine): bash tools/gpu/run.sh STEP...
#   step         what                                                          needs bundles
#   unpack       stage the parts this call carried, unpack the complete bundles -
#   env          the machine, versions, imports, the bundles' declared deps     -
#   plain        the plain single-process loop (tools/gpu/plain_loop_gpu.py)    -
#   vllm_engine  the standalone vLLM engine, its sleep/wake (vllm_engine.py)    vllm
#   gpu_vllm     tests/gpu/test_vllm_rollout_gpu.py: rltrain's vLLM backend     vllm
#   gpu_host     tests/gpu/test_host_rules_gpu.py: host tensors, GPU models     -
#   c_vllm       python -m rltrain: vLLM rollout slept/woken, IPC weights       vllm rest
#   a_fused      python -m rltrain: fused torch workers                         rest
#   b_turns_ipc  python -m rltrain: actor and torch rollout take turns, IPC     rest
#   d_deepspeed  python -m rltrain: DeepSpeed ZeRO-2 offloaded every stage      rest
#   gputests     pytest tests/gpu (each test skips what this machine lacks)     -
#   enginebench  tools/gpu/gpu_bench.py (mover / IPC / DeepSpeed offload)       rest
# Environment:
#   DEADLINE_S    this call's budget (570): a step that cannot get its minimum is skipped,
#                 the others are cut to what is left
#   STEPS         training steps of every run (8); NEW_TOKENS: tokens per response (256)
#   VLLM_EAGER    1: vLLM without torch.compile or CUDA graphs (TORCH_COMPILE_DISABLE=1), for
#                 a short lease; 0: as compiled
#   TF_FALLBACK   auto: retry vLLM with the fallback bundle's transformers if it fails with
#                 the machine's; 1: always; 0: never
#   STOP_WITHOUT  bundles (comma-separated) that earlier calls began carrying: when one is not
#                 complete after unpack, stop (exit status 3) for the recovery call
#   REHEARSAL     1: the CPU stand-in of tools/gpu/rehearse.py: GPU work is not run; what it
#                 needs is checked and its CPU part (the plans) run; REHEARSAL_PLAN=0: not even
#                 that
#   RLTRAIN_GPU_HOME  where parts, bundles and results stay (/tmp/rltrain-gpu)
set -uo pipefail
t_start=$(date +%s)
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
cd "$root"
home=${RLTRAIN_GPU_HOME:-/tmp/rltrain-gpu}
STOP_WITHOUT=${STOP_WITHOUT:-}
res=$home/results
out=${OUT:-$home/out}
deadline=${DEADLINE_S:-570}
steps=${STEPS:-8}
new_tokens=${NEW_TOKENS:-256}
vllm_eager=${VLLM_EAGER:-1}
tf_fallback=${TF_FALLBACK:-auto}
rehearsal=${REHEARSAL:-0}
py=${PYTHON:-python3}
# The prompts are "a+b=" (4 tokens); the plan sizes activations and KV cache, and the rollout
# its engine's max_model_len, from task.max_prompt_length + rollout.max_new_tokens.
prompt_len=8
mkdir -p "$res" "$out" "$home/state"

export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
export RAY_AUTH_MODE=disabled RAY_USAGE_STATS_ENABLED=0 GLOO_SOCKET_IFNAME=lo
export VLLM_USE_FLASHINFER_SAMPLER=0 # flashinfer is not in the bundle
export TORCH_EXTENSIONS_DIR=$home/torch_extensions
export TORCH_CUDA_ARCH_LIST=${DS_ARCH_LIST:-9.0} # DeepSpeed 0.19.8 cannot parse "9.0a"
# The checkout first (what this call carried is what is measured), then the bundles. In a
# rehearsal the local interpreter's packages stand in for the bundles (built for 3.12).
if ((rehearsal)); then
  base_path=$root${PYTHONPATH:+:$PYTHONPATH}
else
  base_path=$root:$home/vllm:$home/rest${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=$base_path

publish() { # every result so far into $OUT, each file replaced whole (a kill leaves the last)
  "$py" "$here/collect.py" "$res" --out "$out/results.json.part" >"$out/.collect.txt" 2>&1 &&
    mv "$out/results.json.part" "$out/results.json"
  # gzip, not xz: this runs after every step, on device time
  tar -C "$res" -czf "$out/logs.tar.gz.part" --exclude=checkpoints --exclude='*.png' \
    --exclude='*.pt' --exclude='*.safetensors' . 2>/dev/null &&
    mv "$out/logs.tar.gz.part" "$out/logs.tar.gz"
  rm -f "$out/.collect.txt"
}
finish() {
  publish
  "$py" "$here/collect.py" "$res" # the short table the reply's output tail ends with
  echo "run.sh: $(($(date +%s) - t_start)) s; results in $out (results.json, logs.tar.gz)"
}
trap finish EXIT

left() { echo $((deadline - ($(date +%s) - t_start))); }

has_bundle() { [[ -f $home/.bundles/$1.json ]]; }

# skip NAME WHY: record that a step did not run and why
skip() {
  mkdir -p "$res/$1"
  rm -f "$res/$1/rc"
  echo "$2" >"$res/$1/rc.skipped"
  echo "== $1: skipped: $2"
}

# step NAME BOX_S MIN_S NEEDS GPU CMD...: run CMD with output in $res/NAME/log.txt, its status
# in rc and its wall seconds in seconds, within BOX_S seconds or what is left of the call;
# skipped when a bundle in NEEDS ("vllm rest", "-") is not unpacked here or less than MIN_S is
# left. GPU=1: in a rehearsal the command is not run (rc.rehearsed) unless it is the CPU part.
step() {
  local name=$1 box=$2 min=$3 needs=$4 gpu=$5 b budget t0 rc
  shift 5
  local dir=$res/$name
  mkdir -p "$dir"
  for b in $needs; do
    [[ $b == - ]] && continue
    if ! has_bundle "$b"; then
      skip "$name" "needs the $b bundle, which is not unpacked on this machine (carry its \
parts: tools/gpu/README.md)"
      publish
      return 0
    fi
  done
  budget=$(($(left) - 15))
  if ((budget < min)); then
    skip "$name" "$(left) s left in this call (DEADLINE_S=$deadline), the step needs $min s"
    publish
    return 0
  fi
  ((box > budget)) && box=$budget
  rm -f "$dir/rc" "$dir/rc.skipped" "$dir/rc.rehearsed"
  "$py" - "$dir/switches.json" "$steps" "$new_tokens" "$vllm_eager" "$rehearsal" "$box" <<'EOF'
import json, sys
path, steps, tokens, eager, rehearsal, box = sys.argv[1:]
json.dump({"steps": int(steps), "max_new_tokens": int(tokens), "vllm_eager": eager == "1",
           "rehearsal": rehearsal == "1", "time_box_s": int(box)}, open(path, "w"))
EOF
  echo "== $name (at most $box s)"
  # wall, user and system seconds of the step and its children (the rehearsal, on a shared
  # machine, also wants the CPU time)
  local TIMEFORMAT="%R %U %S" rehearsal_dir=""
  ((rehearsal && gpu)) && rehearsal_dir=$dir
  { time REHEARSAL_DIR=$rehearsal_dir timeout -k 10 "$box" "$@" >"$dir/log.txt" 2>&1; } \
    2>"$dir/time.txt"
  rc=$?
  ((rehearsal && gpu && rc == 0)) && { echo rehearsed >"$dir/rc.rehearsed"; rc=rehearsed; }
  awk '{printf "%d\n", $1 + 0.5}' "$dir/time.txt" >"$dir/seconds"
  [[ $rc == rehearsed ]] || echo "$rc" >"$dir/rc"
  tail -n 8 "$dir/log.txt"
  echo "== $name: rc=$rc in $(cat "$dir/seconds") s"
  publish
  return 0
}

gpu_gib() {
  if ((rehearsal)); then
    echo 79.10 # the H100's 81559 MiB as torch reports it, for the rehearsal's plans
    return
  fi
  nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1 |
    awk '{printf "%.2f", $1 / 1024}'
}

do_env() {
  local dir=$res/env b
  nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv ||
    echo "(no nvidia-smi here)"
  "$py" - "$dir/machine.json" <<'EOF'
import importlib, json, platform, sys, time
info = {"python": sys.version.split()[0], "platform": platform.platform()}
import torch
info.update(torch=torch.__version__, cuda=torch.version.cuda)
try:
    info.update(device=torch.cuda.get_device_name(),
                device_memory=torch.cuda.get_device_properties(0).total_memory)
except Exception as exc:  # no GPU: the rest of the report still helps
    info["device"] = f"none ({type(exc).__name__}: {exc})"[:300]
for mod in ("transformers", "tokenizers", "ray", "hydra", "omegaconf", "deepspeed", "vllm",
            "rltrain"):
    t0 = time.perf_counter()
    try:
        m = importlib.import_module(mod)
        info[mod] = {"version": getattr(m, "__version__", "?"), "file": m.__file__,
                     "import_s": round(time.perf_counter() - t0, 2)}
    except Exception as exc:  # report every import, not the first failure
        info[mod] = {"error": f"{type(exc).__name__}: {exc}"[:500]}
json.dump(info, open(sys.argv[1], "w"), indent=1)
print(json.dumps({k: v.get("version", v.get("error")) if isinstance(v, dict) else v
                  for k, v in info.items()}, indent=1))
EOF
  for b in vllm rest; do
    has_bundle "$b" || continue
    echo "-- the $b bundle's declared dependencies against this machine:"
    "$py" "$here/check_deps.py" "$home/$b" --live --json "$dir/deps_$b.json" | tail -4
  done
  return 0
}

# the rltrain runs: common overrides, then each run's own
common=(model=qwen2_0_5b placement=collocated cluster.simulate_devices=false
  cluster.devices_per_node=1 rollout.max_new_tokens="$new_tokens"
  trainer.total_steps="$steps" trainer.eval_every=0 logging.progress=false
  task.max_prompt_length="$prompt_len")
declare -A extra=(
  [a_fused]="placement.fuse=true"
  [b_turns_ipc]="weight_sync.transport=ipc placement.fuse=false"
  [c_vllm]="rollout.backend=vllm weight_sync.transport=ipc placement.offload.rollout.when=after_stage ${C_VLLM_EXTRA:-}"
  [d_deepspeed]="actor.backend=deepspeed actor.zero_stage=2 placement.offload.actor.when=after_stage"
)

vllm_env() { # the environment of a vLLM step: the short-lease switch, the transformers chosen
  ((vllm_eager)) && export TORCH_COMPILE_DISABLE=1
  if [[ $(cat "$home/state/transformers" 2>/dev/null) == fallback ]]; then
    export PYTHONPATH=$root:$home/fallback:$home/vllm:$home/rest
    echo "vLLM runs with the fallback bundle's transformers (the vllm_engine step needed it)"
  fi
  return 0
}

do_run() { # NAME: plan with the same overrides, then train with the GPU memory sampled
  local key=$1 dir=$res/$1 rc
  read -r -a own <<<"${extra[$key]}"
  rm -rf "$dir/run" "$dir/plan" "$home/ckpt/$key"
  echo "python -m rltrain ${common[*]} ${own[*]}" >"$dir/cmd.txt"
  [[ $key == c_vllm ]] && vllm_env
  if [[ -n ${REHEARSAL_DIR:-} && ${REHEARSAL_PLAN:-1} == 0 ]]; then
    echo "rehearsal: plan and run skipped (REHEARSAL_PLAN=0)"
    return 0
  fi
  "$py" -m rltrain mode=plan "${common[@]}" "${own[@]}" cluster.device_memory_gib="$(gpu_gib)" \
    hydra.run.dir="$dir/plan" || echo "(the plan refused: see above; the run goes on)"
  if [[ -n ${REHEARSAL_DIR:-} ]]; then
    echo "rehearsal: the run itself needs the GPU"
    return 0
  fi
  nvidia-smi --query-compute-apps=pid,used_memory --format=csv # leftovers would skew memory
  "$py" "$here/memwatch.py" "$dir/mem.tsv" --procs "$dir/mem_procs.tsv" &
  local watcher=$!
  # the first sample is read before the run puts anything on the GPU
  while [[ ! -s $dir/mem.tsv ]] && kill -0 "$watcher" 2>/dev/null; do sleep 0.05; done
  "$py" -m rltrain "${common[@]}" "${own[@]}" hydra.run.dir="$dir/run" \
    cluster.device_memory_gib="$(gpu_gib)" trainer.checkpoint_dir="$home/ckpt/$key"
  rc=$?
  kill "$watcher" && wait "$watcher"
  rm -rf "$home/ckpt/$key" # up to a few GB per run; nothing reads them
  return $rc
}

do_vllm_engine() {
  local dir=$res/vllm_engine rc args
  ((vllm_eager)) && export TORCH_COMPILE_DISABLE=1
  args=(--out "$dir/vllm_engine.json" --steps "$steps" --max-new-tokens "$new_tokens"
    --max-model-len $((prompt_len + new_tokens)) --cycles 2)
  if [[ -n ${REHEARSAL_DIR:-} ]]; then
    echo "rehearsal: the engine needs the GPU"
    return 0
  fi
  if [[ $tf_fallback != 1 ]]; then
    "$py" "$here/vllm_engine.py" "${args[@]}" &&
      { echo machine >"$home/state/transformers"; return 0; }
    rc=$?
    [[ $tf_fallback == 0 ]] && return $rc
    if ! has_bundle fallback; then
      echo "== vLLM failed (rc=$rc); the fallback bundle is not here to retry with"
      return $rc
    fi
    echo "== vLLM failed with the machine's transformers (rc=$rc): again with the fallback's"
  fi
  PYTHONPATH=$root:$home/fallback:$home/vllm "$py" "$here/vllm_engine.py" "${args[@]}" &&
    echo fallback >"$home/state/transformers"
}

plain_micro_batch() { # the actor micro-batch rltrain's plan chooses for a_fused on this GPU
  local own
  read -r -a own <<<"${extra[a_fused]}"
  "$py" - "$(gpu_gib)" "${common[@]}" "${own[@]}" <<'EOF' 2>/dev/null | tail -1
import sys
from rltrain.bench.measures.trainer import compose
from rltrain.placement.micro_batches import choose_micro_batches
run, _ = choose_micro_batches(compose(*sys.argv[2:], f"cluster.device_memory_gib={sys.argv[1]}"))
print(run.actor.micro_batch_size)
EOF
}

do_plain() { # at the fused run's micro-batch (the plan's choice on this GPU), so they compare
  local micro
  micro=$(plain_micro_batch)
  [[ $micro =~ ^[0-9]+$ ]] || { echo "the plan chose no micro-batch here: 64"; micro=64; }
  echo "micro-batch $micro (the plan's for a_fused with this GPU's memory)"
  if [[ -n ${REHEARSAL_DIR:-} ]]; then # its imports only: the loop needs the GPU
    "$py" "$here/plain_loop_gpu.py" --help >/dev/null && echo "rehearsal: imports fine"
    return $?
  fi
  "$py" "$here/plain_loop_gpu.py" --out "$res/plain/plain.json" --steps "$steps" \
    --max-new-tokens "$new_tokens" --micro-batch "$micro"
}

do_enginebench() {
  if [[ -n ${REHEARSAL_DIR:-} ]]; then
    echo "rehearsal: the bench needs the GPU"
    return 0
  fi
  "$py" "$here/gpu_bench.py" --out "$res/enginebench/gpu_bench.json" \
    --sections "${SECTIONS:-mover,ipc,ds2,zero3}" --deadline-s 240
}

do_pytest() { # FILE...: the gpu tests named (each skips what the machine lacks)
  [[ $1 == *vllm* ]] && vllm_env
  if [[ -n ${REHEARSAL_DIR:-} ]]; then
    "$py" -m pytest --collect-only -q -p no:cacheprovider -o addopts="" "$@"
    return $?
  fi
  "$py" -m pytest "$@" -q -p no:cacheprovider -o addopts="" --timeout 200 \
    --junitxml="$res/pytest_$(basename "$1" .py).xml"
}

# export what the step commands (run by `timeout` in a child shell) need
export -f do_env do_run do_vllm_engine do_pytest do_plain do_enginebench gpu_gib has_bundle
export -f plain_micro_batch
export -f vllm_env
export here root home res steps new_tokens tf_fallback base_path prompt_len py vllm_eager
export rehearsal

run_step() { # NAME: the step's command, time-boxed, with its needs and the least time worth it
  case $1 in
    unpack) step unpack 180 1 - 0 bash "$here/unpack.sh" ;;
    env) step env 90 20 - 0 bash -c do_env ;;
    plain) step plain 300 45 - 1 bash -c "$(declare -p common extra); do_plain" ;;
    vllm_engine) step vllm_engine 300 60 vllm 1 bash -c do_vllm_engine ;;
    gpu_vllm) step gpu_vllm 200 45 vllm 1 bash -c 'do_pytest tests/gpu/test_vllm_rollout_gpu.py tests/gpu/test_vllm_continue_gpu.py' ;;
    gpu_host) step gpu_host 90 20 - 1 bash -c 'do_pytest tests/gpu/test_host_rules_gpu.py' ;;
    gputests) step gputests 240 45 - 1 bash -c 'do_pytest tests/gpu' ;;
    a_fused | b_turns_ipc | c_vllm | d_deepspeed)
      local needs=rest min=90
      [[ $1 == c_vllm ]] && needs="vllm rest" && min=100
      [[ $1 == d_deepspeed ]] && min=120
      step "$1" 330 "$min" "$needs" 1 bash -c "$(declare -p common extra); do_run $1"
      if [[ -f $res/$1/rc && $(cat "$res/$1/rc") != 0 ]]; then
        # A failed or killed run may leave Ray's processes holding GPU memory for the next
        # step; on the lent machine every Ray process is this script's.
        "$py" -c "import sys; sys.argv = ['ray', 'stop', '--force']
from ray.scripts.scripts import main; main()" >/dev/null 2>&1 || true
      fi
      ;;
    enginebench) step enginebench 330 60 rest 1 bash -c do_enginebench ;;
    *)
      echo "run.sh: unknown step $1 (see the usage at the top of $0)" >&2
      return 2
      ;;
  esac
}

if (($# == 0)); then
  echo "run.sh: name the steps to run (see the usage at the top of $0)" >&2
  exit 2
fi
# STOP_WITHOUT: bundles that earlier calls began carrying. Missing after this call's unpack,
# the machine is a fresh one that lost them (the next call came after its 30 s): the steps are
# not started, and the operator makes the recovery call at once (tools/gpu/README.md).
steps_left=("$@")
for s in "$@"; do
  steps_left=("${steps_left[@]:1}")
  run_step "$s" || exit 2
  [[ $s == unpack ]] || continue
  for b in ${STOP_WITHOUT//,/ }; do
    has_bundle "$b" && continue
    why="not started: the $b bundle is incomplete here, so this machine is a fresh one that \
lost what earlier calls carried: make the recovery call now (tools/gpu/README.md)"
    for rest in "${steps_left[@]}"; do skip "$rest" "$why"; done
    echo "run.sh: $why" >&2
    exit 3
  done
done
