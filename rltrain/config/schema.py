"""Dataclass schemas of a run's configuration.

The primary config (``conf/config.yaml``) is composed on top of :class:`RunConfig`, so Hydra and
OmegaConf refuse unknown keys and wrong types while composing; :func:`rltrain.config.validate`
then runs the cross-field checks and reports every problem at once. Nothing here imports Ray or
torch. Records are plain (non-frozen) dataclasses because OmegaConf fills them; treat them as
read-only and derive sizes into frozen plan objects instead of mutating them.

Fields typed ``Any`` accept more than one shape (an int or a per-node list, a placement string or
a ``{node_group, placement}`` mapping); their shape is checked by the layer that reads them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from omegaconf import MISSING

#: Components a placement may name. ``inference`` recomputes log-probs on its own devices in
#: disaggregated layouts (as in RLinf); ``env`` hosts simulators for embodied runs.
COMPONENTS = ("actor", "rollout", "reference", "reward", "critic", "inference", "env")

#: State kinds an offload policy may move off a device.
STATE_KINDS = ("weights", "grads", "optimizer", "kv_cache")

#: When a component's state leaves its devices.
OFFLOAD_WHEN = ("never", "after_stage", "on_demand")


# --------------------------------------------------------------------------------------- cluster
@dataclass
class HardwareConfig:
    """Non-accelerator hardware attached to the nodes of a node group (robots, FPGAs, ...)."""

    type: str = MISSING  # a name of your choosing, e.g. "robot"
    count: int = 1  # units per node of the group


@dataclass
class NodeGroupConfig:
    """A labelled subset of nodes; placements may address it by ``node_group: <label>``."""

    label: str = MISSING  # "cluster" and "node" are reserved
    node_ranks: Any = MISSING  # "0-3", "2,3", an int, or a list of ints
    hardware: Optional[HardwareConfig] = None  # resource ranks then count this hardware


@dataclass
class ClusterConfig:
    """Where the job runs: a local Ray with simulated devices, or an existing Ray cluster."""

    address: Optional[str] = None  # null: start a local Ray; "auto" or "host:port": join one
    num_nodes: int = 1  # nodes the placement may use
    devices_per_node: Any = 2  # accelerators per node: an int, or a list with one per node
    # GiB per device. Simulated devices: their capacity (null: 4). GPUs: the most rltrain plans
    # to use of each (null: all of it, read from nvidia-smi before Ray, measured after)
    device_memory_gib: Optional[float] = None
    simulate_devices: bool = True  # declare logical devices when the node has no GPU
    cpus_per_node: Optional[float] = None  # CPUs Ray may schedule per node; null: all cores
    # GiB of host memory per node the plan sizes tool workers against; null: this machine's
    # memory before Ray starts, the memory Ray reports per node after
    host_memory_gib: Optional[float] = None
    # labelled subsets of nodes placements may address
    node_groups: List[NodeGroupConfig] = field(default_factory=list)
    node_order: str = "head_first"  # how discovered nodes get ranks: head_first | ip | label
    runtime_env: Dict[str, Any] = field(default_factory=dict)  # Ray runtime_env for workers
    temp_dir: Optional[str] = None  # local Ray's temp dir; null: a fresh one per run
    startup_timeout_s: float = 120.0  # waiting for actors / placement groups
    # torch.distributed timeout for worker collectives; a weight-sync broadcast's counts from
    # when every receiver takes its version
    collective_timeout_s: float = 300.0
    # data-parallel CPU ranks on one host average gradients through shared memory, not gloo
    host_allreduce: bool = True


# ------------------------------------------------------------------------------------- placement
@dataclass
class OffloadPolicyConfig:
    """Which state of a component may leave its devices, and when.

    ``enable_offload`` / ``offload_weight`` / ``offload_grad`` / ``offload_optimizer`` are RLinf's
    spellings, accepted as aliases: setting any of them overrides ``when`` / ``states``.
    """

    when: str = "never"  # never | after_stage | on_demand
    states: List[str] = field(default_factory=lambda: list(STATE_KINDS))
    enable_offload: Optional[bool] = None  # alias: true -> when=after_stage
    offload_weight: Optional[bool] = None  # alias for "weights" in states
    offload_grad: Optional[bool] = None  # alias for "grads" in states
    offload_optimizer: Optional[bool] = None  # alias for "optimizer" in states


@dataclass
class AutoPlacementConfig:
    """placement=auto (rltrain.autoplace): profile short runs, predict every candidate layout's
    seconds per step, rank them, run the winner (mode=plan: print the ranking only)."""

    profile_steps: int = 5  # steps per profiling run; the first is warm-up and is not timed (>= 2)
    time_limit_s: float = 300.0  # wall-clock s after which no profiling run starts (> 0)
    # where profiles are cached by (model, task, cluster); null: ~/.cache/rltrain/profiles
    cache_dir: Optional[str] = None
    reprofile: bool = False  # ignore a cached profile and measure again
    # layout families to enumerate: any of collocated, disaggregated, hybrid
    candidates: List[str] = field(default_factory=lambda: ["collocated", "disaggregated", "hybrid"])
    # trainer.max_staleness values tried where rollout and actor hold separate devices (0 and/or 1)
    staleness: List[int] = field(default_factory=lambda: [0, 1])
    # trainer.partial_rollout policies tried by candidates with max_staleness 1 (finish,
    # continue, restart; carry, which runs at max_staleness 2; needs 1 in staleness); null:
    # [finish, continue], or only trainer.partial_rollout where that is set to restart,
    # continue or carry (docs/auto_placement.md)
    partial_rollout: Optional[List[str]] = None
    # embodied: env.pipeline_stage_num values tried; empty: 1, 2, 4, 8 where env.num_envs divides
    pipeline_stages: List[int] = field(default_factory=list)
    max_checked: int = 32  # candidates checked with the plan and preflight, fastest predicted first
    # runs of each profiling layout (later ones in reverse order); each keeps its fastest reading
    # (2 on a machine shared with other work)
    profile_passes: int = 1


@dataclass
class PlacementConfig:
    """Which devices each component uses, and how components sharing a device take turns."""

    # collocated | disaggregated | hybrid: checked against the layout; auto: rltrain chooses
    mode: Optional[str] = None
    component_placement: Dict[str, Any] = MISSING  # RLinf grammar, e.g. {"actor,rollout": "all"}
    # component -> OffloadPolicyConfig. Typed Any so that one override adds a component's policy
    # (+placement.offload.reference={when: after_stage}; OmegaConf cannot add a mapping to a
    # dict of structured values); each entry is checked against OffloadPolicyConfig on load.
    offload: Dict[str, Any] = field(default_factory=dict)
    isolate_accelerator: bool = True  # a process sees only its own devices
    # auto | true | false: run actor, rollout and the rule reward in one process per device
    # when they share the devices and nothing has to move (rltrain.runners.fusion); the
    # shipped placement=collocated and placement=auto set auto
    fuse: str = "false"
    auto: AutoPlacementConfig = field(default_factory=AutoPlacementConfig)  # used by mode=auto


# ----------------------------------------------------------------------------------------- model
#: The ``model`` fields that size a model built from the config (each a positive integer).
MODEL_SIZE_FIELDS = (
    "hidden_size",
    "intermediate_size",
    "num_layers",
    "num_heads",
    "num_kv_heads",
    "max_position_embeddings",
)


#: Special tokens of the built-in tokenizer (:mod:`rltrain.tasks.tokenizer`), in id order:
#: padding, end of sequence, unknown; the characters of ``model.vocab_chars`` follow them.
SPECIAL_TOKENS = ("<pad>", "<eos>", "<unk>")


@dataclass
class ModelConfig:
    """The policy model: a local Hugging Face checkpoint, or a tiny one built from these fields."""

    # local HF checkpoint directory (task.generate writes one there); null: build from the
    # fields below
    path: Optional[str] = None
    tokenizer_path: Optional[str] = None  # null: the checkpoint's, or the built-in tokenizer
    family: str = "llama"  # llama | qwen2 (when building from fields)
    hidden_size: int = 64  # built model: hidden width (embodied: of the policy and value MLPs)
    intermediate_size: int = 128  # built model: MLP width
    num_layers: int = 2  # built model: transformer layers (embodied: hidden layers of the MLPs)
    num_heads: int = 4  # built model: attention heads
    num_kv_heads: int = 4  # built model: key/value heads (grouped-query attention)
    # built model: longest sequence; caps the plan's sequence length
    max_position_embeddings: int = 64
    # embedding rows; null: the tokenizer's size (a larger value pads the embedding, as real
    # checkpoints do; a smaller one is refused)
    vocab_size: Optional[int] = None
    tie_word_embeddings: bool = False  # the LM head shares the input embedding's weights
    # float32 | bfloat16 | float16: the compute dtype of every copy of the model; the torch
    # actor and critic train fp32 master weights (float16 with loss scaling); null: model.path's
    # torch_dtype (config.json), else float32
    dtype: Optional[str] = None
    init_seed: int = 0  # seed of the random initialisation
    vocab_chars: Optional[str] = None  # built-in tokenizer alphabet; null: digits, "+-*/=(). "

    def __post_init__(self) -> None:
        # dtype null follows the checkpoint, decided when the record is made, so that every
        # reader (the plan, the engines, the workers) sees a concrete dtype
        if self.dtype is None:
            from rltrain.config.files import model_dtype

            self.dtype = model_dtype(self.path, None)


@dataclass
class OptimizerConfig:
    # adamw | deepspeed_adamw (DeepSpeed's fused Adam, with actor.backend=deepspeed)
    name: str = "adamw"
    lr: float = 3e-4  # actor learning rate (after warmup)
    betas: List[float] = field(default_factory=lambda: [0.9, 0.999])  # Adam's two betas
    eps: float = 1e-8  # Adam's epsilon
    weight_decay: float = 0.0  # decoupled weight decay (AdamW)
    grad_clip: float = 1.0  # max global grad norm; 0 disables clipping
    warmup_steps: int = 0  # optimizer steps of linear learning-rate warmup from 0


# ------------------------------------------------------------------------------------- algorithm
@dataclass
class AlgorithmConfig:
    """Advantage estimator, policy loss and KL settings."""

    # how each response token's advantage is computed (gae needs a critic placed)
    advantage_estimator: str = "grpo"
    # the surrogate the update minimises (gspo: use with algorithm=gspo's clip ranges)
    policy_loss: str = "ppo_clip"
    norm_adv_by_std: bool = True  # GRPO divides by the group std; Dr. GRPO does not
    kl_coef: float = 0.0  # weight of the KL to the reference policy (> 0 needs a reference)
    kl_estimator: str = "k3"  # k1 | k2 | k3
    kl_in: str = "loss"  # loss | reward
    clip_low: float = 0.2  # ratio clipped to [1 - clip_low, 1 + clip_high]
    clip_high: float = 0.2  # upper clip of the ratio (DAPO's clip-higher when > clip_low)
    # token_mean | seq_mean_token_sum | seq_mean_token_mean | seq_mean_token_sum_norm (Dr. GRPO)
    loss_agg: str = "token_mean"
    entropy_coef: float = 0.0  # entropy bonus weight
    ppo_epochs: int = 1  # passes over each rollout batch
    num_minibatches: int = 1  # optimizer steps per epoch
    gamma: float = 1.0  # GAE discount
    lam: float = 1.0  # GAE lambda
    value_clip: float = 0.2  # PPO value clipping
    value_coef: float = 0.5  # PPO value-loss weight
    # where the clipped ratio's pi_old comes from: auto | recompute (the actor's log-probs
    # before the update) | rollout (the rollout engine's, as sampled); auto recomputes when
    # the rollout is not the actor's numerics (vLLM, 16-bit, LoRA, top_p < 1) or
    # trainer.max_staleness >= 1 (docs/rl_core.md)
    old_logprobs: str = "auto"
    # truncated importance sampling with a recomputed pi_old: each token's policy loss is
    # weighted by min(pi_old / pi_rollout, tis_cap) (at least 1); null: no correction
    tis_cap: Optional[float] = 2.0
    # DAPO's dynamic sampling: drop prompt groups whose rewards are all equal (no signal) and
    # generate more prompts until the training batch is full (synchronous schedule only)
    filter_groups: bool = False
    # generation rounds a step may take to fill the batch with filter_groups; when they run
    # out the batch is topped up with dropped groups (metric batch/topped_up_groups)
    max_generation_batches: int = 4
    # DAPO's overlong shaping: the last overlong_buffer tokens of rollout.max_new_tokens carry
    # a reward penalty growing linearly to overlong_penalty at the budget; 0: none (single-turn:
    # refused with task.env)
    overlong_buffer: int = 0
    overlong_penalty: float = 1.0  # the penalty at the full budget (with overlong_buffer > 0)
    # drop responses the token budget cut (no EOS) from the loss; they still count in their
    # group's advantage statistics
    mask_truncated: bool = False


# ------------------------------------------------------------------------------------------ task
@dataclass
class TaskConfig:
    """What the policy learns. Built-in tasks generate their data from ``seed``."""

    name: str = "arithmetic"  # arithmetic | jsonl | gym
    # seeds the built-in and generated data, the train/eval split and the order prompts are drawn
    seed: int = 0
    num_train: int = 0  # prompts generated for training; 0: every prompt the task defines
    num_eval: int = 0  # prompts held out for greedy evaluation; 0: evaluate on the training set
    max_operand: int = 4  # arithmetic: operands are 0..max_operand
    # prompt/answer rows: a .jsonl, .json or .parquet file, or a datasets.save_to_disk directory
    path: Optional[str] = None
    eval_path: Optional[str] = None  # held-out eval rows, same formats; then num_eval must be 0
    # render prompts with the tokenizer's chat template; null: when the tokenizer has one
    chat_template: Optional[bool] = None
    system_prompt: Optional[str] = None  # a system message before every prompt (chat template)
    # write a built-in synthetic data set first (gsm8k_tiny): its train/eval parquet files to
    # task.path / task.eval_path and a base chat checkpoint built from the model fields to
    # model.path, when missing
    generate: Optional[str] = None
    # dataset field of the prompt (a string or {role, content} messages; a.b: nested)
    prompt_key: str = "prompt"
    answer_key: str = "answer"  # dataset field of the reference answer
    reward_fn: Optional[str] = None  # dotted path "pkg.module:function"; null: the task's own
    # prompt tokens a row may hold (chat template applied); longer rows are refused when the
    # dataset is checked, and the plan sizes activations and KV cache from it
    max_prompt_length: int = 512
    env_id: str = "CartPole-v1"  # gym: any registered Gymnasium id
    params: Dict[str, Any] = field(default_factory=dict)  # task-specific extras
    # a text environment "pkg.module:Class" (docs/agents.md): each prompt becomes a multi-turn
    # episode with tools (reset / step / close, tools = its public documented methods); null:
    # single-turn responses scored by the task's reward
    env: Optional[str] = None


# ------------------------------------------------------------------------------------ components
@dataclass
class LoraConfig:
    """LoRA adapters (peft) on the policy: ``rank > 0`` trains the adapters only."""

    rank: int = 0  # adapter rank; 0: train the full model
    alpha: float = 16.0  # adapter scale numerator (scale = alpha / rank)
    dropout: float = 0.0  # dropout on the adapters' input while training
    # module names (suffixes) that get adapters
    target_modules: List[str] = field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"]
    )


@dataclass
class ActorConfig:
    backend: str = "torch"  # the training engine (rltrain.kinds: one of its names)
    tensor_parallel_size: int = 1  # 1 only: the torch and DeepSpeed engines do not shard by TP
    pipeline_parallel_size: int = 1  # 1 only: no pipeline parallelism in the training engines
    # sequences per forward/backward; null: the largest that fits, chosen by the plan (one size
    # for every micro-batch key left null, at most a rank's rows per optimizer step; printed)
    micro_batch_size: Optional[int] = None
    # tokens (prompt + response, padded) per forward/backward: micro-batches formed by a token
    # budget instead of micro_batch_size rows; null: fixed micro_batch_size rows
    max_tokens_per_micro_batch: Optional[int] = None
    lora: LoraConfig = field(default_factory=LoraConfig)  # LoRA adapters instead of full training
    zero_stage: int = 0  # deepspeed: 0-3; the plan divides optimizer state by the DP size
    gradient_checkpointing: bool = False  # recompute activations in the backward pass (less memory)


@dataclass
class RolloutConfig:
    backend: str = "torch"  # the generation engine (rltrain.kinds: one of its names)
    tensor_parallel_size: int = 1  # GPUs per vLLM engine (torch engine: 1)
    pipeline_parallel_size: int = 1  # 1 only
    n_samples_per_prompt: int = 16  # group size for GRPO-style estimators
    temperature: float = 1.0  # sampling temperature
    top_p: float = 1.0  # nucleus sampling mass
    max_new_tokens: int = 4  # response budget in tokens
    # in_order: rank r gets the r-th slice of the step's prompts; length_aware: packed over the
    # ranks by expected response length, longest first (docs/async.md#length-aware-dispatch)
    dispatch: str = "in_order"
    gpu_memory_utilization: float = 0.3  # share of device memory a vLLM engine reserves
    # vLLM: tokens per sequence, at most the model's context; null: prompt + new tokens (capped)
    max_model_len: Optional[int] = None
    max_turns: int = 1  # with task.env: model turns per episode (each ends at EOS or a tool call)
    # with task.env: response tokens per episode, turns and tool results together; null:
    # max_turns x max_new_tokens plus the tool results
    max_total_tokens: Optional[int] = None


@dataclass
class InferenceConfig:
    """Log-prob recomputation on its own devices (disaggregated layouts)."""

    tensor_parallel_size: int = 1  # 1 only: the inference worker holds the whole model
    pipeline_parallel_size: int = 1  # 1 only
    micro_batch_size: Optional[int] = None  # sequences per forward; null: chosen by the plan


@dataclass
class ReferenceConfig:
    micro_batch_size: Optional[int] = None  # sequences per forward; null: chosen by the plan


@dataclass
class RewardConfig:
    kind: str = "rule"  # rule (the task's reward function) | model
    model_path: Optional[str] = None  # reward model checkpoint when kind=model
    # kind=model: sequences per forward; null: chosen by the plan
    micro_batch_size: Optional[int] = None


@dataclass
class CriticConfig:
    lr: float = 1e-3  # critic learning rate
    # sequences per forward/backward; null: chosen by the plan
    micro_batch_size: Optional[int] = None


@dataclass
class EnvConfig:
    """Simulator workers for embodied runs."""

    num_envs: int = 16  # environments per rollout epoch, over all env processes
    pipeline_stage_num: int = 2  # groups of sub-environments per env process
    rollout_steps: int = 128  # env steps per environment per iteration
    eval_episodes: int = 100  # greedy evaluation episodes (each on its own environment)
    # stop once the greedy mean return reaches this; a positive one also holds evaluations back
    # until the training return first reaches half of it
    target_return: Optional[float] = None
    # linear decay: update i (0-based) trains at optimizer.lr x (1 - (1 - this) x i /
    # trainer.total_steps), so the last one at optimizer.lr x (this + (1 - this) / total_steps)
    lr_final_fraction: float = 1.0


@dataclass
class SimulateConfig:
    """Modelled device time, added to the real compute, so that schedules and placements can be
    compared on CPU as they would behave on devices (benchmarks, sweeps, placement=auto). All
    zero (off) by default; refused on real GPUs (docs/runtime.md)."""

    actor_latency_ms: float = 0.0  # per actor update (reasoning and embodied actors)
    rollout_latency_ms: float = 0.0  # per generate call of the reasoning rollout
    # embodied: a pipeline stage of m environments waits m * (latency + U(0, jitter)) ms per
    # env step (the policy's inference waits env_policy_latency_ms, not this)
    env_step_latency_ms: float = 0.0
    env_step_jitter_ms: float = 0.0  # U(0, jitter) added to each env step's latency
    env_policy_latency_ms: float = 0.0  # per observation the embodied policy infers
    env_policy_jitter_ms: float = 0.0  # U(0, jitter) added to each inference's latency
    # per decoding step of a reasoning generate call: it waits this x its longest response (in
    # tokens) on top of rollout_latency_ms, so response lengths cost modelled device time
    rollout_token_latency_ms: float = 0.0
    # heavy-tailed response lengths (0: off, the real responses' lengths): each row of a
    # reasoning generate call gets a modelled length, log-normal with this median in tokens,
    # sigma 1, capped at 16x the median (drawn per step and rank), and the call is charged
    # rollout_token_latency_ms x its longest modelled row instead of its real decoding steps
    response_length_median: float = 0.0
    tool_latency_ms: float = 0.0  # with task.env: each tool call waits this long first
    # with task.env: share of tool calls that raise (seeded), marking their episodes infra-failed
    tool_failure_rate: float = 0.0


@dataclass
class ToolsConfig:
    """The tool workers of multi-turn rollouts (``task.env``, docs/agents.md)."""

    # tool worker actors (component ``tools``): each hosts environment instances and runs
    # their tool calls; by default placed on the CPU-only nodes (every node when none is)
    pool_size: int = 2
    cpus_per_worker: float = 0.5  # CPUs each tool worker reserves in Ray (threads: int, min 1)
    memory_gib_per_worker: float = 0.5  # GiB of Ray memory each tool worker reserves
    # per tool call and per environment reset, timed from its start: longer fails its episode
    timeout_s: float = 10.0
    concurrency: int = 8  # tool calls one tool worker runs at once (its actor's threads)
    # the most episodes one generating process decodes at once (continuous batching: an
    # episode leaves the decoding batch while its tool runs and joins it again when the reply
    # arrives; fewer slots than episodes staggers them so tool waits overlap others' decoding);
    # 0: every episode of the batch (docs/agents.md)
    slots: int = 0


@dataclass
class WhatifConfig:
    """The what-if step simulator behind mode=plan (rltrain.whatif): predict seconds per step,
    per stage and per device, for this cluster or for hardware you do not have."""

    # an accelerator of the catalogue (conf/whatif/devices: h100, h200, a100, l40s, b200, h20);
    # null: the configured cluster's own devices (simulated ones with their simulate.* latencies)
    hardware: Optional[str] = None
    # the link between nodes (conf/whatif/links: infiniband, roce, ethernet, ...); null:
    # infiniband with whatif.hardware, the host's memory on simulated devices
    link: Optional[str] = None
    steps: int = 20  # steps simulated; the prediction averages all but the first
    train_utilization: float = 0.4  # share of the BF16 peak a training (and log-prob) pass reaches
    # response lengths: max (every response runs to rollout.max_new_tokens) | uniform (1..max) |
    # lognormal (mean response_length_mean, spread response_length_sigma, capped at the max)
    response_length: str = "max"
    response_length_mean: Optional[float] = None  # lognormal: mean tokens; null: half the max
    response_length_sigma: float = 0.8  # lognormal: sigma of log length
    # mode=plan also ranks placement=auto's candidate layouts by the simulator
    rank_candidates: bool = True
    # fit calibration factors from placement=auto's cached profiles of this run when present
    calibrate: bool = True


@dataclass
class WeightSyncConfig:
    """How new actor weights reach the rollout (rltrain.backends.weight_sync)."""

    # auto | host | collective | ipc; auto: what the plan allows and is fastest there
    transport: str = "auto"


# --------------------------------------------------------------------------------------- trainer
#: ``trainer.sampler`` values (rltrain.whatif.samplers).
SAMPLERS = ("in_order", "fifo", "windowed")
#: ``rollout.dispatch`` values (rltrain.runners.dispatch).
DISPATCHES = ("in_order", "length_aware")


@dataclass
class TrainerConfig:
    total_steps: int = 500  # policy updates (the default run reaches 0.9 accuracy in ~250)
    train_batch_size: int = 8  # prompts per step (each sampled n_samples_per_prompt times)
    # steps between greedy evaluations; 0: none but the one after the last step (or after the
    # step trainer.time_budget_s stops the run at)
    eval_every: int = 25
    target_accuracy: Optional[float] = None  # stop once greedy eval accuracy reaches this
    save_every: int = 0  # steps between checkpoints; 0: only at the end
    checkpoint_dir: Optional[str] = None  # local path or fsspec URI; null: <run dir>/checkpoints
    resume: Optional[str] = None  # null | auto | a checkpoint path
    max_restarts: int = 0  # automatic resumes after a worker failure
    max_staleness: int = 0  # weight versions rollout may lag behind the actor
    # finish | restart | continue: what a generation running at a weight swap does (restart and
    # continue need max_staleness >= 1: a synchronous loop has none running then); carry: rows
    # unfinished when a call has its batch of complete groups are carried into the next call
    # (needs max_staleness >= 2 and the torch engine, which decodes them in segments;
    # docs/async.md#carry)
    partial_rollout: str = "finish"
    # carry: decoding steps between two re-packings of the rollout's slots (null: 4)
    carry_segment: Optional[int] = None
    # carry: steps of prompt groups the rollout's buffer holds beyond the step a call hands on
    # (primed before the first call), 1..max_staleness-1; deeper keeps the slots busy behind a
    # long row, and each group waits that many calls longer (null: 1; docs/async.md#carry)
    carry_surplus: Optional[int] = None
    # in_order: step s trains the generation sent for step s; fifo: the freshest completed
    # rollout shards, those past max_staleness dropped; windowed: the same within the last
    # sampler_window versions (needs max_staleness >= 1; docs/async.md#samplers)
    sampler: str = "in_order"
    # windowed: shards sampled by the last W weight versions train (staleness <= W - 1), 1..k
    sampler_window: Optional[int] = None
    # stop after the step in which this many seconds pass, evaluated as the last step is and
    # with a checkpoint
    time_budget_s: Optional[float] = None


@dataclass
class LoggingConfig:
    jsonl: bool = True  # metrics.jsonl in the run directory, always on by default
    tensorboard: bool = False  # also log to TensorBoard (pip install 'rltrain[track]')
    wandb: bool = False  # also log to Weights & Biases
    mlflow: bool = False  # also log to MLflow
    project: str = "rltrain"  # project name for W&B and MLflow
    progress: bool = True  # live progress line in the terminal
    trace: bool = True  # per-device timeline (Chrome trace JSON)


# ------------------------------------------------------------------------------------------- run
@dataclass
class RunConfig:
    """The whole configuration of one run (the composed primary config)."""

    mode: str = "train"  # train | plan
    runner: str = "reasoning"  # the runner kind (rltrain.kinds: one of its names)
    # seeds sampling, minibatch shuffling and environments; not the data order (task.seed) nor a
    # built model's weights (model.init_seed)
    seed: int = 1
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    placement: PlacementConfig = field(default_factory=PlacementConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    task: TaskConfig = field(default_factory=TaskConfig)
    actor: ActorConfig = field(default_factory=ActorConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    inference: InferenceConfig = field(default_factory=InferenceConfig)
    reference: ReferenceConfig = field(default_factory=ReferenceConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    critic: CriticConfig = field(default_factory=CriticConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    weight_sync: WeightSyncConfig = field(default_factory=WeightSyncConfig)
    simulate: SimulateConfig = field(default_factory=SimulateConfig)
    tools: ToolsConfig = field(default_factory=ToolsConfig)
    whatif: WhatifConfig = field(default_factory=WhatifConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
