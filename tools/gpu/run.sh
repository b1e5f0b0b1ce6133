#!/usr/bin/env bash
# Everything issue 20 measures on a lent GPU machine, step by step, each step time-boxed and
# its output kept when a later one fails. One device command runs at most 10 minutes, so the
# steps are spread over a few calls made back to back (tools/gpu/README.md gives the calls);
# results of earlier calls stay in $RLTRAIN_GPU_HOME/results while the machine is kept, and
# every call returns all of them so far: $OUT/results.json (tools/gpu/collect.py) and
# $OUT/logs.tar.xz (each step's log, metrics, summary, plan, trace and memory samples).
#
# Usage (repository root, on the GPU machine): bash tools/gpu/run.sh STEP...
#   unpack       gather the carried parts and extract the bundle (tools/gpu/unpack.sh)
#   env          the machine, versions, imports, the bundle's declared deps against it
#   plain        the plain single-process loop (tools/gpu/plain_loop_gpu.py)
#   vllm_engine  the standalone vLLM engine and its sleep/wake (tools/gpu/vllm_engine.py)
#   a b c d      python -m rltrain: fused torch / turns over ipc / vLLM / DeepSpeed ZeRO-2
#   gputests     pytest tests/gpu (issue 10's checks)
#   enginebench  tools/gpu/gpu_bench.py (issue 10's offload / IPC / DeepSpeed figures)
#   all          env plain vllm_engine a b c d
# Environment: DEADLINE_S (this call's budget, default 570: steps that cannot get 45 s are
#   skipped, the others are cut to what is left), STEPS (20), NEW_TOKENS (256),
#   TF_FALLBACK (auto: retry vLLM with the bundle's older transformers if it fails with the
#   machine's; 1: always use it; 0: never), RLTRAIN_GPU_HOME (/tmp/rltrain-gpu).
set -uo pipefail
t_start=$(date +%s)
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
cd "$root"
home=${RLTRAIN_GPU_HOME:-/tmp/rltrain-gpu}
res=$home/results
out=${OUT:-$home/out}
deadline=${DEADLINE_S:-570}
steps=${STEPS:-20}
new_tokens=${NEW_TOKENS:-256}
tf_fallback=${TF_FALLBACK:-auto}
# The prompts are "a+b=" (4 tokens); the plan sizes activations and KV cache, and the rollout
# its engine's max_model_len, from task.max_prompt_length + rollout.max_new_tokens.
prompt_len=8
mkdir -p "$res" "$out" "$home/state"

export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
export RAY_AUTH_MODE=disabled RAY_USAGE_STATS_ENABLED=0 GLOO_SOCKET_IFNAME=lo
export VLLM_USE_FLASHINFER_SAMPLER=0 # flashinfer is not in the bundle
export TORCH_EXTENSIONS_DIR=$home/torch_extensions
export TORCH_CUDA_ARCH_LIST=${DS_ARCH_LIST:-9.0} # DeepSpeed 0.19.8 cannot parse "9.0a"
# The checkout first (what this call carried is what is measured), then the bundle.
base_path=$root:$home/site${PYTHONPATH:+:$PYTHONPATH}
export PYTHONPATH=$base_path

finish() {
  python3 "$here/collect.py" "$res" --out "$out/results.json" || true
  tar -C "$res" -cJf "$out/logs.tar.xz" --exclude=checkpoints --exclude='*.png' \
    --exclude='*.pt' --exclude='*.safetensors' . 2>/dev/null || true
  echo "run.sh: $(($(date +%s) - t_start)) s; results in $out (results.json, logs.tar.xz)"
}
trap finish EXIT

left() { echo $((deadline - ($(date +%s) - t_start))); }

# step NAME BOX_S CMD...: run CMD with output in $res/NAME/log.txt and its status in rc,
# within BOX_S seconds or what is left of the call.
step() {
  local name=$1 box=$2
  shift 2
  local dir=$res/$name budget
  budget=$(($(left) - 15))
  mkdir -p "$dir"
  if ((budget < 45)); then
    echo "== $name: skipped, $(left) s left in this call (DEADLINE_S=$deadline)"
    echo skipped >"$dir/rc.skipped"
    return 0
  fi
  ((box > budget)) && box=$budget
  echo "== $name (at most $box s)"
  rm -f "$dir/rc" "$dir/rc.skipped"
  timeout -k 10 "$box" "$@" >"$dir/log.txt" 2>&1
  local rc=$?
  echo "$rc" >"$dir/rc"
  tail -n 15 "$dir/log.txt"
  echo "== $name: rc=$rc"
  return 0
}

gpu_gib() {
  nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1 |
    awk '{printf "%.2f", $1 / 1024}'
}

do_env() {
  local dir=$res/env
  nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv
  python3 - "$dir/machine.json" <<'EOF'
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
print(json.dumps(info, indent=1))
EOF
  python3 "$here/check_deps.py" "$home/site" --live --json "$dir/deps.json"
  echo "-- with the fallback transformers/tokenizers ahead:"
  [[ -d $home/fallback ]] && python3 "$here/check_deps.py" "$home/site" --fallback \
    "$home/fallback" --live | tail -3
  return 0
}

# the rltrain runs: common overrides, then each run's own
common=(model=qwen2_0_5b placement=collocated cluster.simulate_devices=false
  cluster.devices_per_node=1 rollout.max_new_tokens="$new_tokens"
  trainer.total_steps="$steps" trainer.eval_every=0 logging.progress=false
  task.max_prompt_length="$prompt_len")
declare -A extra=(
  [a]="placement.fuse=true"
  [b]="weight_sync.transport=ipc placement.fuse=false"
  [c]="rollout.backend=vllm weight_sync.transport=ipc placement.offload.rollout.when=after_stage"
  [d]="actor.backend=deepspeed actor.zero_stage=2 placement.offload.actor.when=after_stage"
)
declare -A dirname=([a]=a_fused [b]=b_turns_ipc [c]=c_vllm [d]=d_deepspeed)

do_run() { # KEY: plan with the same overrides, then train with the GPU memory sampled
  local key=$1 dir=$res/${dirname[$1]} rc
  read -r -a own <<<"${extra[$key]}"
  rm -rf "$dir/run" "$dir/plan" "$home/ckpt/$key"
  echo "python -m rltrain ${common[*]} ${own[*]}" >"$dir/cmd.txt"
  python3 -m rltrain mode=plan "${common[@]}" "${own[@]}" cluster.device_memory_gib="$(gpu_gib)" \
    hydra.run.dir="$dir/plan" || echo "(the plan refused: see above; the run goes on)"
  if [[ $key == c && $(cat "$home/state/transformers" 2>/dev/null) == fallback ]]; then
    export PYTHONPATH=$root:$home/fallback:$home/site
    echo "vLLM runs with the bundle's transformers (the vllm_engine step needed it)"
  fi
  nvidia-smi --query-compute-apps=pid,used_memory --format=csv # leftovers would skew memory
  python3 "$here/memwatch.py" "$dir/mem.tsv" &
  local watcher=$!
  sleep 0.5 # a first sample before the run puts anything on the GPU
  python3 -m rltrain "${common[@]}" "${own[@]}" hydra.run.dir="$dir/run" \
    trainer.checkpoint_dir="$home/ckpt/$key"
  rc=$?
  kill "$watcher" && wait "$watcher"
  export PYTHONPATH=$base_path
  rm -rf "$home/ckpt/$key" # up to a few GB per run; nothing reads them
  return $rc
}

do_vllm_engine() {
  local dir=$res/vllm_engine rc
  if [[ $tf_fallback != 1 ]]; then
    python3 "$here/vllm_engine.py" --out "$dir/vllm_engine.json" --steps "$steps" \
      --max-new-tokens "$new_tokens" --max-model-len $((prompt_len + new_tokens)) &&
      { echo machine >"$home/state/transformers"; return 0; }
    rc=$?
    [[ $tf_fallback == 0 || ! -d $home/fallback ]] && return $rc
    echo "== vLLM failed with the machine's transformers (rc=$rc): again with the bundle's"
  fi
  PYTHONPATH=$root:$home/fallback:$home/site python3 "$here/vllm_engine.py" \
    --out "$dir/vllm_engine.json" --steps "$steps" --max-new-tokens "$new_tokens" \
    --max-model-len $((prompt_len + new_tokens)) &&
    echo fallback >"$home/state/transformers"
}

do_gputests() {
  python3 -m pytest tests/gpu -q -p no:cacheprovider -o addopts="" --timeout 200
}

# export what the step commands (run by `timeout` in a child shell) need
export -f do_env do_run do_vllm_engine do_gputests gpu_gib
export here root home res steps new_tokens tf_fallback base_path prompt_len

run_step() { # NAME: the step's command, time-boxed
  case $1 in
    unpack) step unpack 120 bash "$here/unpack.sh" ;;
    env) step env 120 bash -c do_env ;;
    plain)
      step plain 300 python3 "$here/plain_loop_gpu.py" --out "$res/plain/plain.json" \
        --steps "$steps" --max-new-tokens "$new_tokens"
      ;;
    vllm_engine) step vllm_engine 330 bash -c do_vllm_engine ;;
    a | b | c | d)
      step "${dirname[$1]}" 330 bash -c "$(declare -p common extra dirname); do_run $1"
      if [[ $(cat "$res/${dirname[$1]}/rc" 2>/dev/null) != 0 ]]; then
        # A failed or killed run may leave Ray's processes holding GPU memory for the next
        # step; on the lent machine every Ray process is this script's.
        python3 -c "import sys; sys.argv = ['ray', 'stop', '--force']
from ray.scripts.scripts import main; main()" >/dev/null 2>&1 || true
      fi
      ;;
    gputests) step gputests 240 bash -c do_gputests ;;
    enginebench)
      step enginebench 330 python3 "$here/gpu_bench.py" --out "$res/enginebench/gpu_bench.json" \
        --sections "${SECTIONS:-mover,ipc,ds2,zero3}" --deadline-s 240
      ;;
    all) for s in env plain vllm_engine a b c d; do run_step "$s"; done ;;
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
for s in "$@"; do
  run_step "$s" || exit 2
  if [[ $s == unpack && $(cat "$res/unpack/rc" 2>/dev/null) != 0 ]]; then
    echo "run.sh: the bundle is not unpacked: the other steps need it" >&2
    exit 2
  fi
done
