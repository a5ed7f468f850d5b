"""THE one place that builds each step's command line; where each step's files go is `steps.contracts.layout`.

The Argo templates (`workflows/iteration.py`) and the local runner (`workflows/local.py`) both call
these functions: on Argo the arguments are partly `{{...}}` placeholders Argo fills in, locally they
are real values; the command is the same `python -m steps.X ...` line either way.

    from workflows.commands import rollout
    rollout(config, task="steps/tasks/builtin/hello-file", rollout_id="it0-hello-file-s0", sample=0,
            proxy_url="http://127.0.0.1:8100", out=layout.rollout_url(config.run_url, 0, "it0-hello-file-s0"))
"""

import json
from collections.abc import Sequence

from steps import sampling
from steps.proxy.config import ROLLOUT_LIMITS, limit_flag
from steps.contracts import layout
from steps.contracts.config import RunConfig

PROXY_PORT = 8100


# The update's keys the run sets itself (`update_overrides`), each with the run's key that sets it: `update_args`
# may not set them, so the update and the rest of the run (the sampler, the plan) cannot disagree.
RUN_UPDATE_KEYS = {"adv_estimator": "adv_estimator", "learning_rate": "learning_rate", "epochs": "epochs",
                   "seed": "seed", "temperature": "temperature", "unmatched_sampling": "allow_unmatched_sampling",
                   "lora_rank": "lora_rank", "lora_alpha": "lora_alpha", "lora_target_modules": "lora_target_modules",
                   "drop_flat_groups": "drop_flat_groups"}


def update_overrides(config: RunConfig) -> list[str]:
    """The run's `update_args`, then its algorithm settings, as `key=value` overrides of the update's own config
    file (same names); its logprobs are computed at the temperature the rollouts were sampled with, and it is told
    of settings it cannot reproduce. `drop_flat_groups` is passed only when off (the update's default is on).

    >>> update_overrides(RunConfig(update_args=("mini_batches=4",)))[:2]
    ['mini_batches=4', 'adv_estimator=grpo']
    >>> update_overrides(RunConfig(drop_flat_groups=False))[-1]
    'drop_flat_groups=false'
    """
    unmatched = sampling.unmatched(sampling.settings(config))
    return [*config.update_args, f"adv_estimator={config.adv_estimator}", f"learning_rate={config.learning_rate!r}",
            f"epochs={config.epochs}", f"seed={config.seed}", f"temperature={config.temperature!r}",
            *([f"unmatched_sampling={sampling.describe(unmatched)}"] if unmatched else []), *lora_overrides(config),
            *([] if config.drop_flat_groups else ["drop_flat_groups=false"])]


def lora_overrides(config: RunConfig) -> list[str]:
    """The run's LoRA keys as the update's overrides; none when LoRA is off (the update's defaults are off).

    >>> lora_overrides(RunConfig(lora_rank=8, lora_target_modules=("q_proj", "v_proj")))
    ['lora_rank=8', 'lora_alpha=16', 'lora_target_modules=["q_proj", "v_proj"]']
    """
    if not config.lora_rank:
        return []
    return [f"lora_rank={config.lora_rank}", f"lora_alpha={config.lora_alpha}",
            f"lora_target_modules={json.dumps(list(config.lora_target_modules))}"]


# ---- the commands ----

def serve(config: RunConfig, model: str, store: str, weight_version: str | int, host: str = "127.0.0.1",
          device: str = "cpu", port: int = PROXY_PORT, python: str = "python", model_dir: str | None = None,
          tasks: str | None = None, results_of: int | None = None) -> list[str]:
    """vLLM on `model` (a folder, or a URL fetched to `model_dir`) plus the recording proxy on
    `host:port` (`steps.serve`), `serve_replicas` vLLM servers behind it when more than one; with
    `config.upstream`, only the proxy, in front of that server (no `model`, no vLLM options: `upstream_model`,
    empty for `model_name`, is what it is sent).

    What one rollout may take (`steps.proxy.config.ROLLOUT_LIMITS`) is passed only where the run changes it. With
    `tasks` (an Argo run's `layout.datasets_url`), the proxy serves rollout pods their task folders from there.
    With `results_of`, an iteration, the proxy writes the results its rollout pods send it (`steps.proxy.results`).

    >>> serve(RunConfig(upstream="http://10.0.0.5:8000", model_name="m"), "unused", "calls", 0)[:7]
    ['python', '-m', 'steps.serve', '--upstream', 'http://10.0.0.5:8000', '--upstream-model', 'm']
    >>> serve(RunConfig(store_quota_mb=64), "m", "calls", 0)[-2:]
    ['--store-quota-mb', '64']
    >>> serve(RunConfig(judge_upstream="http://10.0.0.7/v1", judge_model="j"), "m", "calls", 0)[-4:]
    ['--judge-upstream', 'http://10.0.0.7/v1', '--judge-model', 'j']
    """
    proxy = ["--model-name", config.model_name, "--port", str(port), "--store", store, "--host", host,
             *(["--tasks", tasks] if tasks else []),
             *(["--run-url", config.run_url, "--iteration", str(results_of)] if results_of is not None else [])]
    if config.upstream:
        return [python, "-m", "steps.serve", "--upstream", config.upstream,
                "--upstream-model", config.upstream_model or config.model_name, *proxy,
                "--max-tokens-cap", str(config.max_tokens_cap), "--weight-version", str(weight_version),
                *sampling.as_flags(sampling.settings(config)), *limit_flags(config), *judge_flags(config)]
    return [python, "-m", "steps.serve", "--model", model, *(["--model-dir", model_dir] if model_dir else []),
            *proxy, "--device", device, "--gpus", str(config.serve_gpus),
            *(["--replicas", str(config.serve_replicas)] if config.serve_replicas > 1 else []),
            "--max-tokens-cap", str(config.max_tokens_cap),
            "--generation-config", "vllm",
            "--weight-version", str(weight_version), *vllm_flags(config, device),
            *sampling.as_flags(sampling.settings(config)), *limit_flags(config), *judge_flags(config)]


def judge_flags(config: RunConfig) -> list[str]:
    """The run's judge as the serve step's flags (the proxy's judge route: steps/proxy/judge.py); none without one.
    Its key is never here: the serve pod's environment holds it (`judge_secret`)."""
    return ["--judge-upstream", config.judge_upstream, "--judge-model", config.judge_model] \
        if config.judge_upstream else []


def limit_flags(config: RunConfig) -> list[str]:
    """The run's limits of what one rollout may take, as the serve step's flags (the proxy's); each left at its
    default is left out (the proxy's default is the run's).

    >>> limit_flags(RunConfig(request_image_mb=8)), limit_flags(RunConfig())
    (['--request-image-mb', '8'], [])
    """
    return [word for key in ROLLOUT_LIMITS if getattr(config, key) != getattr(RunConfig, key)
            for word in (limit_flag(key), str(getattr(config, key)))]


def vllm_flags(config: RunConfig, device: str) -> list[str]:
    """The run's serving options as `steps.serve` flags; what is left at its default is left out.

    >>> vllm_flags(RunConfig(reasoning_parser="qwen3", vllm_args=("--enable-prefix-caching",)), "cpu")
    ['--reasoning-parser', 'qwen3', '--vllm-arg=--enable-prefix-caching']
    """
    flags = [f for key in ("tool_call_parser", "reasoning_parser", "max_model_len", "max_pixels", "chat_template")
             if getattr(config, key) for f in (f"--{key.replace('_', '-')}", str(getattr(config, key)))]
    if config.image_limit != RunConfig.image_limit:
        flags += ["--image-limit", str(config.image_limit)]
    if device == "gpu":
        flags += ["--gpu-memory-utilization", str(config.gpu_memory_utilization)]
    return flags + lora_flags(config) + [f"--vllm-arg={arg}" for arg in config.vllm_args]


def lora_flags(config: RunConfig) -> list[str]:
    """A LoRA run's serve flags: its rank, and its base model (iteration 0's checkpoint), which the serve fetches
    once while each iteration's checkpoint holds only the adapter; none for a full-weight run.

    >>> lora_flags(RunConfig()), lora_flags(RunConfig(lora_rank=8, model="models/base"))
    ([], ['--lora-rank', '8', '--base-model', 'models/base'])
    """
    if config.lora_rank <= 0:
        return []
    return ["--lora-rank", str(config.lora_rank), "--base-model", config.checkpoint_url(0)]


def fetch_model(config: RunConfig, python: str = "python") -> list[str]:
    """Fetches the hub `model` into the run's store, unless the run holds it already (`steps.fetch_model`); the
    token is the step's environment's, never an argument.

    >>> fetch_model(RunConfig(model="hf://Qwen/Qwen3-8B", run="demo"))[3:]
    ['--model', 'hf://Qwen/Qwen3-8B', '--run-url', 'runs/demo', '--endpoint', 'https://huggingface.co']
    """
    return [python, "-m", "steps.fetch_model", "--model", config.model, "--run-url", config.run_url,
            "--endpoint", config.hub_endpoint]


def task_image_prefix(config: RunConfig) -> str:
    """What a built task image's name starts with (`steps.plan.task_image` adds the task and its content tag): the
    plan names its rollouts' images with it, and `python workflows/submit.py images --dataset D` pushes them so."""
    return f"{config.image_registry}/task-"


def stored_dataset(config: RunConfig, evaluation: bool = False) -> str:
    """Which of an Argo run's dataset snapshots (`layout.DATASETS`) its rollouts (with `evaluation`, its
    evaluations') read: the eval one only where the run has an `eval_dataset` of its own.

    >>> stored_dataset(RunConfig(), evaluation=True), stored_dataset(RunConfig(eval_dataset="held-out"), True)
    ('train', 'eval')
    """
    return layout.EVAL_DATASET if evaluation and config.eval_dataset else layout.TRAIN_DATASET


def stored_dataset_url(config: RunConfig, evaluation: bool = False) -> str:
    """The URL of that snapshot in the run's store (what an Argo run's plan and evaluate steps read)."""
    return layout.dataset_url(layout.datasets_url(config.run_url), stored_dataset(config, evaluation))


def plan(config: RunConfig, iteration: int | str, python: str = "python", evaluation: bool = False,
         app_rollouts: str | None = None, dataset: str | None = None, chunks: bool = False,
         tasks: int | None = None, exclude: Sequence[str] = ()) -> list[str]:
    """Prints the iteration's rollouts as a JSON list (`steps.plan`); with `evaluation`, those of the
    evaluation of its checkpoint: every task of `eval_dataset`, `eval_k` tries each. With `app_rollouts`, those
    of tasks with an `[environment] app` go to that file instead. `dataset`: read that instead of the config's
    (an Argo run's snapshot in the store, `stored_dataset_url`). With `chunks`, the lists go to the store in chunks
    (`plan_folder`) and the step prints their numbers. A fill round's (`fill_batch`, the local runner's): `tasks`
    more tasks (not `tasks_per_iteration`), none of the `exclude` ones, which the iteration ran already."""
    if evaluation:
        chosen = ["--eval", "--dataset", dataset or config.evaluation_dataset, "--iteration", str(iteration),
                  "--samples-per-task", str(config.eval_k)]
    else:
        chosen = ["--dataset", dataset or config.dataset, "--iteration", str(iteration), "--tasks-per-iteration",
                  str(tasks or config.tasks_per_iteration), "--samples-per-task", str(config.samples_per_task),
                  *curriculum_flags(config), *[flag for name in exclude for flag in ("--exclude", name)]]
    return [python, "-m", "steps.plan", *chosen, "--seed", str(config.seed),
            "--image-prefix", task_image_prefix(config),
            *(["--app-rollouts", app_rollouts] if app_rollouts else []),
            *(["--chunks", plan_folder(config, iteration, evaluation)] if chunks else [])]


def curriculum_flags(config: RunConfig) -> list[str]:
    """The plan step's curriculum flags (`steps.curriculum`); none when the curriculum is off.

    >>> curriculum_flags(RunConfig(curriculum="pass_rate", store="runs", run="demo"))[:4]
    ['--curriculum', 'pass_rate', '--curriculum-window', '4']
    """
    if config.curriculum == "off":
        return []
    return ["--curriculum", config.curriculum, "--curriculum-window", str(config.curriculum_window),
            "--curriculum-min-pass", repr(config.curriculum_min_pass), "--curriculum-max-pass",
            repr(config.curriculum_max_pass), "--curriculum-pass-reward", repr(config.curriculum_pass_reward),
            "--run-url", config.run_url, "--run", config.run]


def plan_folder(config: RunConfig, iteration: int | str, evaluation: bool = False) -> str:
    """Where the plan step writes an iteration's (or its evaluation's) plan in chunks (`layout.plan_url`)."""
    return (layout.eval_plan_url if evaluation else layout.plan_url)(config.run_url, iteration)


def plan_chunk(url: str, python: str = "python") -> list[str]:
    """Prints one chunk of a plan (`steps.plan chunk`, `layout.plan_chunk_url`) for its rollouts' `withParam`."""
    return [python, "-m", "steps.plan", "chunk", url]


def rollout(config: RunConfig, task: str, rollout_id: str, sample: int | str, proxy_url: str, out: str,
            python: str = "python", isolation: str = "bwrap", attempt: int = 1, retry: str | None = None,
            send_result: str | None = None) -> list[str]:
    """Attempt `attempt` of the planned rollout `rollout_id` (or, with `retry`, Argo's `{{retries}}`, attempt
    retry + 1), sample `sample` of `task`, through the proxy; exit code 3 means infra_error (`steps.rollout`).

    `isolation`: "bwrap" (a local bubblewrap sandbox) or "pod" (the Kubernetes rollout pod is the sandbox).
    `send_result` ("iteration" or "evaluation"): the result.json also goes to the proxy, which writes it to the store.
    """
    return [python, "-m", "steps.rollout", "--task", task, "--harness", config.harness, "--proxy-url", proxy_url,
            "--rollout-id", rollout_id, "--sample", str(sample), *(["--attempt", str(attempt)] if attempt != 1 else []),
            *(["--retry", retry] if retry is not None else []),
            "--out", out, "--model-name", config.model_name,
            *(["--isolation", isolation] if isolation != "bwrap" else []),
            *(["--send-result", send_result] if send_result else []), *rollout_limits(config)]


def rollout_limits(config: RunConfig) -> list[str]:
    """The run's limits on what a rollout may take and leave behind, as the rollout step's flags; those at the step's
    own default are left out, so a plain run's command reads as before.

    >>> rollout_limits(RunConfig(rollout_log_mb=4, harness_memory_mb=3072))
    ['--harness-memory-mb', '3072', '--log-mb', '4']
    """
    flags = {"--harness-memory-mb": "harness_memory_mb", "--log-mb": "rollout_log_mb",
             "--graded-max-files": "graded_max_files", "--graded-copy-s": "graded_copy_s"}
    default = RunConfig()
    return [arg for flag, key in flags.items() if getattr(config, key) != getattr(default, key)
            for arg in (flag, str(getattr(config, key)))]


def trajectories(config: RunConfig, proxy_url: str, results: str, iteration: int | str,
                 python: str = "python", out: str | None = None) -> list[str]:
    """The iteration's Parquet tables from the rollout results and the proxy's calls (`steps.trajectories`),
    under the run's trajectories, or under `out` (an evaluation's, never trained: nothing is dropped); with
    `max_staleness` >= 1, a training sample more than that many versions behind is dropped. The base model's
    config checks each call's image tokens (they do not change with the weights), at the pixel cap vLLM was given;
    an `upstream` has none here.

    >>> trajectories(RunConfig(max_pixels=200704), "http://127.0.0.1:8100", "results", 0)[-4:]
    ['--model', 'runs/tiny-model', '--max-pixels', '200704']
    """
    stale = ["--max-staleness", str(config.max_staleness)] if config.max_staleness and out is None else []
    pixels = ["--max-pixels", str(config.max_pixels)] if config.max_pixels else []
    model = [] if config.upstream else ["--model", config.checkpoint_url(0), *pixels]
    return [python, "-m", "steps.trajectories", "--proxy-url", proxy_url, "--results", results,
            "--out", out or layout.trajectories_url(config.run_url), "--run", config.run, "--iteration", str(iteration),
            "--rollout-retries", str(config.rollout_retries), *model, *stale]


def fetch_task(proxy_url: str, dataset: str, task: str, into: str, python: str = "python",
               wait_s: int = 0) -> list[str]:
    """Fetches one task folder of an Argo run's dataset snapshot `dataset` from the proxy into `into/<task>`
    (`steps.datasets fetch-task`, with the admin key from the environment), waiting up to `wait_s` for it to answer."""
    return [python, "-m", "steps.datasets", "fetch-task", "--proxy-url", proxy_url, "--dataset", dataset,
            "--task", task, "--into", into, *(["--wait-s", str(wait_s)] if wait_s else [])]


def wait_proxy(proxy_url: str, wait_s: int, python: str = "python") -> list[str]:
    """Waits up to `wait_s` seconds for the proxy at `proxy_url` to answer (`steps.datasets wait-proxy`)."""
    return [python, "-m", "steps.datasets", "wait-proxy", "--proxy-url", proxy_url, "--wait-s", str(wait_s)]


def evaluate(config: RunConfig, iteration: int | str, python: str = "python", dataset: str | None = None) -> list[str]:
    """The evaluation of iteration `iteration`'s checkpoint from its results: the table, summary.json
    (`steps.evaluate`); `dataset` as in `plan`."""
    served, model = config.evaluated(iteration)
    return [python, "-m", "steps.evaluate", "--results", layout.eval_results_url(config.run_url, iteration),
            "--k", str(config.eval_k), "--out", layout.eval_summary_url(config.run_url, iteration),
            "--harness", config.harness, "--dataset", dataset or config.evaluation_dataset, "--checkpoint", served,
            "--model", model, "--iteration", str(iteration), "--rollout-retries", str(config.rollout_retries)]


# The port rank 0 of a multi-node update listens on for the other nodes' ranks (torchrun's static rendezvous).
UPDATE_MASTER_PORT = 29500


def update(config: RunConfig, trajectories: str, checkpoint: str, out: str, python: str = "python",
           node_rank: str | None = None, master_addr: str | None = None) -> list[str]:
    """The veRL update from `checkpoint` on `trajectories` (their images in the run's image folder), writing the
    next checkpoint to `out` (`steps.update`).

    One process when `update_gpus` <= 1 and `update_nodes` is 1; else under torchrun (`steps.update.launch`,
    which keeps the update's exit codes), `update_gpus` processes per node (FSDP2 shards over all of them).
    Across `update_nodes` nodes each pod passes its `node_rank` and rank 0's `master_addr` (on Argo:
    placeholders its JobSet fills in, `workflows/iteration.py`).

    >>> update(RunConfig(update_gpus=2), "t", "c", "o")[:6]
    ['python', '-m', 'steps.update.launch', '--standalone', '--nproc-per-node', '2']
    >>> update(RunConfig(max_pixels=200704), "t", "c", "o")[13:15]  # images gridded at serving's cap
    ['--max-pixels', '200704']

    With `lora_rank` > 0 `checkpoint` is the previous update's adapter (iteration 0's: the base model itself) and
    the base model is iteration 0's checkpoint:

    >>> update(RunConfig(lora_rank=8, model="models/base"), "t", "runs/r/checkpoints/iteration-1", "o")[7:9]
    ['--base-model', 'models/base']
    """
    base = ["--base-model", config.checkpoint_url(0)] if config.lora_rank else []
    step = ["-m", "steps.update", "--trajectories", trajectories, "--checkpoint", checkpoint, *base,
            "--out", out, "--images", layout.images_url(config.run_url), "--config", config.update_config,
            *(["--max-pixels", str(config.max_pixels)] if config.max_pixels else []), *update_overrides(config)]
    return launched(config, step, python, node_rank, master_addr)


def launched(config: RunConfig, step: list[str], python: str = "python", node_rank: str | None = None,
             master_addr: str | None = None) -> list[str]:
    """`step` (`-m steps.X ...`) as the update's pods run it: one process when `update_gpus` <= 1 and `update_nodes`
    is 1; else under torchrun (`steps.update.launch`), `update_gpus` processes per node, across `update_nodes`
    nodes each pod with its `node_rank` and rank 0's `master_addr`.

    >>> launched(RunConfig(update_gpus=4), ["-m", "steps.sft"])
    ['python', '-m', 'steps.update.launch', '--standalone', '--nproc-per-node', '4', '-m', 'steps.sft']
    """
    per_node = str(max(config.update_gpus, 1))
    if config.update_nodes > 1:
        if node_rank is None or master_addr is None:
            raise ValueError("a multi-node update needs each pod's node_rank and rank 0's master_addr")
        return [python, "-m", "steps.update.launch", "--nnodes", str(config.update_nodes),
                "--node-rank", node_rank, "--master-addr", master_addr, "--master-port", str(UPDATE_MASTER_PORT),
                "--nproc-per-node", per_node, *step]
    if config.update_gpus > 1:
        return [python, "-m", "steps.update.launch", "--standalone", "--nproc-per-node", per_node, *step]
    return [python, *step]


def served_first(config: RunConfig, iteration: int) -> int:
    """The checkpoint a serve of iteration `iteration` starts on: its own, or with `max_staleness` S >= 1 on Argo,
    checkpoint `iteration` - S (the driver submits the iteration once that one is written), then follows the
    newer ones (`follow_flags`).

    An iteration that evaluates its checkpoint (`eval_every`) starts on it: the driver waits for it.

    >>> served_first(RunConfig(), 3), served_first(RunConfig(max_staleness=1), 3), served_first(RunConfig(max_staleness=2), 1)
    (3, 2, 0)
    """
    return iteration if config.evaluates_at(iteration) else max(iteration - config.max_staleness, 0)


def follow_flags(config: RunConfig, iteration: int) -> list[str]:
    """`steps.serve`'s flags to swap in each checkpoint after the one it started on, up to the iteration's own."""
    return ["--follow-run-url", config.run_url, "--follow-until", str(iteration)] \
        if served_first(config, iteration) < iteration else []


def wait_checkpoint(config: RunConfig, iteration: int, python: str = "python") -> list[str]:
    """Blocks until checkpoint `iteration` (what the previous iteration's update writes) is complete; exit code 1
    when that iteration failed, or after `update_timeout_s` (a record that never says so: `steps.follow wait`)."""
    return [python, "-m", "steps.follow", "wait", "--run-url", config.run_url, "--version", str(iteration),
            "--timeout-s", str(config.update_timeout_s)]


def record(config: RunConfig, iteration: int | str, workflow: str, status: str, checkpoint: str,
           next_checkpoint: str, python: str = "python") -> list[str]:
    """Writes one iteration's outcome into the run manifest (`steps.manifest record`)."""
    return [python, "-m", "steps.manifest", "record", "--run-url", config.run_url, "--iteration", str(iteration),
            "--workflow", workflow, "--status", status, "--checkpoint", checkpoint,
            "--next-checkpoint", next_checkpoint]


def record_eval(config: RunConfig, iteration: int | str, workflow: str, status: str, python: str = "python") -> list[str]:
    """Writes one evaluation's outcome and overall numbers into the run manifest (`steps.manifest record-eval`)."""
    return [python, "-m", "steps.manifest", "record-eval", "--run-url", config.run_url, "--iteration", str(iteration),
            "--workflow", workflow, "--status", status, "--checkpoint", config.evaluated(iteration)[0],
            "--summary", layout.eval_summary_url(config.run_url, iteration)]


def report(config: RunConfig, python: str = "python") -> list[str]:
    """The run's report, written to `layout.reports_url(run_url)` in the store (`steps.report`)."""
    return [python, "-m", "steps.report", "--run", config.run, "--store", config.store]


def resume(config: RunConfig, argo_server: str, python: str = "python") -> list[str]:
    """The driver continuing the run from its manifest in the store (`submit.py resume`), talking to `argo_server`:
    what the detached driver's pod runs, each attempt the same (resume skips what succeeded, follows what runs)."""
    return [python, "workflows/submit.py", "resume", "--run", config.run, "--argo-server", argo_server,
            f"store={config.store}"]


def sft_samples(config: RunConfig, source: str, student: str, python: str = "python") -> list[str]:
    """SFT samples from the recorded run at `source` (its URL in the store) for the `student` checkpoint, kept by
    the run's `sft_min_reward`, into the SFT run's iteration-0 partition (`steps.sft.samples`).

    >>> sft_samples(RunConfig(run="s", store="runs"), "runs/ev", "m")[-2:]
    ['--min-reward', '1.0']
    """
    return [python, "-m", "steps.sft.samples", "--source", source, "--model", student,
            "--out", layout.run_partition_url(config.run_url, config.run, 0), "--run", config.run,
            "--min-reward", repr(config.sft_min_reward)]


def sft(config: RunConfig, student: str, python: str = "python") -> list[str]:
    """Supervised fine-tuning of `student` on the SFT run's samples (`steps.sft`), written as the checkpoint its
    iteration 1 would serve (`layout.checkpoint_url`): the run's `update_args`, then its step size, passes and seed;
    on one node's `update_gpus` ranks (`launched`; `submit.py sft` refuses `update_nodes` > 1); with `lora_rank`, a
    LoRA adapter (`lora_overrides`).

    >>> sft(RunConfig(run="s", store="runs", learning_rate=1e-5), "m")[-3:]
    ['learning_rate=1e-05', 'epochs=1', 'seed=0']
    >>> sft(RunConfig(run="s", store="runs", update_gpus=8), "m")[1:7]
    ['-m', 'steps.update.launch', '--standalone', '--nproc-per-node', '8', '-m']
    """
    step = ["-m", "steps.sft", "--samples", layout.run_partition_url(config.run_url, config.run, 0),
            "--checkpoint", student, "--out", layout.checkpoint_url(config.run_url, 1, config.model),
            "--config", config.update_config, *config.update_args, f"learning_rate={config.learning_rate!r}",
            f"epochs={config.epochs}", f"seed={config.seed}", *lora_overrides(config)]
    return launched(config, step, python)
