"""Where a run's files live: every URL under the run's folder in the store, and nowhere else.

    from steps.contracts import layout
    run = layout.run_url("s3://openforge/runs", "demo")
    layout.result_url(run, 0, "it0-hello-file-s0")  # 's3://openforge/runs/demo/results/iteration-0/it0-hello-file-s0/result.json'

The tree below `<store>/<run>/` (a local folder, or an `s3://` URL on a cluster):

    <store>/<run>/
    ├── manifest/
    │   ├── run.json                      the run's config, written once when the run starts (an eval run's
    │   │                                 also says what it evaluates: steps.manifest.EVAL_FIELD)
    │   ├── datasets.json                 Argo runs: where each dataset came from, its tasks pinned by content
    │   │                                 hash (and a Harbor dataset's git commits), written at submit
    │   ├── base-model.json               a hub `model`: the commit fetched, its files (steps.fetch_model)
    │   ├── iteration-<N>.json            one per iteration: workflow, checkpoints, phase, the update's metrics
    │   └── eval-<N>.json                 one per evaluation: workflow, checkpoint, phase, the overall numbers
    ├── datasets/                         Argo runs: a snapshot of the tasks, uploaded at submit (steps.datasets)
    │   ├── train/<task>/...              the run's `dataset`: one folder per task (task.toml, tests/, ...)
    │   └── eval/<task>/...               its `eval_dataset`, when it has one
    ├── calls/                            the proxy's store (steps.proxy.store owns what is inside:
    │   ├── rollouts/<rollout_id>/...     rollout.json, then calls.jsonl or calls/<index>.json)
    │   └── images/<sha256>               every image a call sent, once, named by the SHA-256 of its bytes
    ├── plans/
    │   └── iteration-<N>/                the plan in chunks, one JSON list each (steps.plan --chunks):
    │       └── <fan-out>-<K>.json        rollouts-<K>.json, app-rollouts-<K>.json (K 0, 1, ...)
    ├── results/
    │   ├── iteration-<N>/
    │   │   └── <rollout_id>/result.json  one folder per rollout attempt (steps.rollout's OUT)
    │   └── iteration-<N>-attempt-<K>/    local runner: what an earlier, dead start of iteration N left
    ├── trajectories/
    │   └── run=<run>/iteration=<N>/      calls.parquet, rollouts.parquet, samples.parquet, behaviour.parquet
    ├── base-model/                       a hub `model` (hf://org/name): its files, fetched once
    │                                     (steps.fetch_model);
    │                                     iteration 0 serves and trains from here; manifest/base-model.json,
    │                                     written last, pins the commit they are from and marks them complete
    ├── checkpoints/
    │   └── iteration-<N>/                N >= 1: what iteration N-1's update wrote (iteration 0 serves
    │       └── metrics.json              the run's `model`); the update's metrics beside the weights
    ├── evals/
    │   └── iteration-<N>/                one evaluation of the checkpoint iteration N serves (an eval run: N 0)
    │       ├── plan/<fan-out>-<K>.json   the evaluation's plan in chunks, as under plans/
    │       ├── results/<rollout_id>/     result.json per eval rollout attempt, as under results/
    │       ├── results-attempt-<K>/      local runner: what an earlier, dead start of the evaluation left
    │       ├── trajectories/             run=<run>/iteration=<N>/: the eval's calls and rollouts tables
    │       └── summary.json              per task and overall: tries, pass@1, pass@k, pass^k, ... (steps.evaluate)
    ├── logs/                             local runner: one log per step, serve's and vLLM's
    ├── tracking/                         the run's `trackers` (steps.tracking): tensorboard/ event files unless
    │                                     `tensorboard_dir` says elsewhere; a local run's W&B folder (wandb/)
    └── reports/                          the run's report (steps.report): index.html and its pages

Beside the runs, `<store>/task-contexts/<task>-<hash>.tar.gz` holds each task image's build context
(`task_context_url`), which `python workflows/submit.py images --dataset D` uploads and the in-cluster build reads.

Every step and both runners (`workflows/local.py`, `workflows/iteration.py`) take their URLs from here,
so a run written by one is read by the other. This module imports nothing beyond the standard library:
the rollout pod's Python imports it through `steps.rollout`.
"""

from urllib.parse import quote

RESULT_FILE = "result.json"  # the rollout step's output, in its OUT folder
# Beside it, its status and reward as one-word files: the rollout node's Argo output parameters.
STATUS_FILE, REWARD_FILE = "status", "reward"
# Beside them, the phase a rollout is in (setup, agent, calls, grading, done): what its runner reads when it has to
# stop the rollout at its deadline (workflows/local.py).
PHASE_FILE = "phase"
# In the store, beside where a rollout pod's result.json goes: the phase its runner last reported through the proxy
# (setup, then agent just before the agent starts), so the collector knows whose end a pod without a result was
# (`steps.ends`); only the runner, with the proxy's admin key, can write it.
PHASE_RECORD = "phase.json"
METRICS_FILE = "metrics.json"  # the update's metrics, in the checkpoint folder it wrote
# A LoRA run's checkpoint (after iteration 0's base) is peft's adapter folder: this file beside the adapter's weights.
ADAPTER_CONFIG = "adapter_config.json"
# A `model` that names a Hugging Face Hub repository (`hf://org/name[@revision]`) rather than a folder or a URL in the
# store: fetched into the run's `base-model/` (`steps.fetch_model`), which iteration 0 then serves and trains from.
HUB_SCHEME = "hf://"


def _join(url: str, *parts: str) -> str:
    return "/".join([url.rstrip("/"), *parts])


def run_url(store: str, run: str) -> str:
    """The run's folder or URL; everything the run writes lives under it.

    >>> run_url("s3://bucket/runs/", "demo")
    's3://bucket/runs/demo'
    """
    return _join(store, run)


def task_context_url(store: str, task: str, tag: str) -> str:
    """A task image's build context in the store: its environment folder as a tar.gz, named by the task and the
    folder's content hash (the image's tag), so an unchanged folder is uploaded once.

    >>> task_context_url("s3://bucket/runs/", "hello-file", "0123456789abcdef")
    's3://bucket/runs/task-contexts/hello-file-0123456789abcdef.tar.gz'
    """
    return _join(store, "task-contexts", f"{task}-{tag}.tar.gz")


# The run's datasets in the store: its `dataset` and (when set) its `eval_dataset`, one folder of task folders each.
TRAIN_DATASET, EVAL_DATASET = "train", "eval"
DATASETS = (TRAIN_DATASET, EVAL_DATASET)


def datasets_url(run_url: str) -> str:
    """The folder of the run's dataset snapshots (what the proxy serves rollout pods their tasks from)."""
    return _join(run_url, "datasets")


def dataset_url(datasets: str, dataset: str) -> str:
    """One dataset's snapshot (`TRAIN_DATASET` or `EVAL_DATASET`) below `datasets` (`datasets_url`).

    >>> dataset_url(datasets_url("s3://b/runs/demo"), EVAL_DATASET)
    's3://b/runs/demo/datasets/eval'
    """
    if dataset not in DATASETS:
        raise ValueError(f"dataset must be one of {', '.join(DATASETS)}, got {dataset!r}")
    return _join(datasets, dataset)


def calls_url(run_url: str) -> str:
    """The proxy's store: one record per model call, by rollout."""
    return _join(run_url, "calls")


def images_url(run_url: str) -> str:
    """The run's images, each stored once under the SHA-256 of its bytes (hex): what calls and samples name.

    >>> images_url("s3://bucket/runs/demo")
    's3://bucket/runs/demo/calls/images'
    """
    return _join(calls_url(run_url), "images")


def all_results_url(run_url: str) -> str:
    """The folder holding every iteration's results folder (`iteration-<N>`, and set-aside starts)."""
    return _join(run_url, "results")


def results_url(run_url: str, iteration: int | str) -> str:
    """The folder holding one `<rollout_id>/result.json` per rollout attempt of an iteration."""
    return _join(all_results_url(run_url), f"iteration-{iteration}")


def rollout_url(run_url: str, iteration: int | str, rollout_id: str) -> str:
    """One rollout attempt's folder (the rollout step's `--out`)."""
    return _join(results_url(run_url, iteration), rollout_id)


def plan_url(run_url: str, iteration: int | str) -> str:
    """The folder of an iteration's plan, in chunks (`plan_chunk_url`).

    >>> plan_url("runs/demo", 0)
    'runs/demo/plans/iteration-0'
    """
    return _join(run_url, "plans", f"iteration-{iteration}")


def curriculum_url(run_url: str, iteration: int | str) -> str:
    """The curriculum's task pool as an iteration's plan saw it (`steps.curriculum.TaskPool`), beside its chunks.

    >>> curriculum_url("runs/demo", 3)
    'runs/demo/plans/iteration-3/curriculum.json'
    """
    return _join(plan_url(run_url, iteration), "curriculum.json")


def plan_chunk_url(plan: str, fanout: str, chunk: int | str) -> str:
    """Chunk number `chunk` (0, 1, ...) of one fan-out of a plan (`fanout`: "rollouts" or "app-rollouts") in the
    plan's folder `plan` (`plan_url`, `eval_plan_url`): one JSON list of planned rollouts.

    >>> plan_chunk_url("runs/demo/plans/iteration-0", "app-rollouts", 3)
    'runs/demo/plans/iteration-0/app-rollouts-3.json'
    """
    return _join(plan, f"{fanout}-{chunk}.json")


def result_url(run_url: str, iteration: int | str, rollout_id: str) -> str:
    """One rollout attempt's `result.json`."""
    return _join(rollout_url(run_url, iteration, rollout_id), RESULT_FILE)


def beside_result(result_url_: str, name: str) -> str:
    """The file `name` in the folder of a `result.json` URL (`result_url`, `eval_result_url`).

    >>> beside_result("s3://b/runs/r/results/iteration-0/t-s0-a2/result.json", PHASE_RECORD)
    's3://b/runs/r/results/iteration-0/t-s0-a2/phase.json'
    """
    return _join(result_url_.rsplit("/", 1)[0], name)


def set_aside_results_url(run_url: str, iteration: int, attempt: int) -> str:
    """Where the local runner moves the results of iteration `iteration`'s start number `attempt` (0, 1, ...)
    when a later start runs it again.

    >>> set_aside_results_url("runs/demo", 1, 0)
    'runs/demo/results/iteration-1-attempt-0'
    """
    return f"{results_url(run_url, iteration)}-attempt-{attempt}"


def trajectories_url(run_url: str) -> str:
    """Where the trajectories step writes; each iteration's tables are a partition below it."""
    return _join(run_url, "trajectories")


def run_partitions_url(trajectories: str, run_name: str) -> str:
    """The folder holding one run's partitions (`iteration=<N>`) below `trajectories`."""
    return _join(trajectories, f"run={run_name}")


def partition_url(trajectories: str, run_name: str, iteration: int | str) -> str:
    """The folder holding one run-iteration's tables below `trajectories` (Hive-style names, so that
    `pyarrow.dataset` reads the whole folder as one dataset partitioned by run and iteration).

    >>> partition_url("s3://b/runs/demo/trajectories", "demo", 2)
    's3://b/runs/demo/trajectories/run=demo/iteration=2'
    """
    return _join(run_partitions_url(trajectories, run_name), f"iteration={iteration}")


def run_partition_url(run_url: str, run_name: str, iteration: int | str) -> str:
    """One iteration's tables of the run at `run_url` (named `run_name`): what its update trains on."""
    return partition_url(trajectories_url(run_url), run_name, iteration)


def table_url(partition: str, table: str) -> str:
    """One table's file in a partition folder."""
    return _join(partition, f"{table}.parquet")


def staleness_url(partition: str) -> str:
    """The trajectories step's staleness figures beside a partition's tables (`_` first: a Parquet dataset
    reader passes it by, as it does Hive's `_SUCCESS`).

    >>> staleness_url("runs/demo/trajectories/run=demo/iteration=2")
    'runs/demo/trajectories/run=demo/iteration=2/_staleness.json'
    """
    return _join(partition, "_staleness.json")


def checkpoint_url(run_url: str, iteration: int, base_model: str) -> str:
    """The checkpoint iteration `iteration` serves: the base model (a hub model's copy in the run), then what the
    previous update wrote.

    >>> checkpoint_url("runs/demo", 0, "models/base"), checkpoint_url("runs/demo", 2, "models/base")
    ('models/base', 'runs/demo/checkpoints/iteration-2')
    >>> checkpoint_url("s3://b/runs/demo", 0, "hf://Qwen/Qwen3-8B@main")
    's3://b/runs/demo/base-model'
    """
    if iteration == 0:
        return base_model_url(run_url) if base_model.startswith(HUB_SCHEME) else base_model
    return _join(run_url, "checkpoints", f"iteration-{iteration}")


def base_model_url(run_url: str) -> str:
    """Where a hub model's files are fetched to in the run (`steps.fetch_model`): iteration 0's checkpoint."""
    return _join(run_url, "base-model")


def base_model_record_url(run_url: str) -> str:
    """The record of a hub model's fetch (`manifest/base-model.json`): the commit it pinned and its files; written
    last, so a run holding it holds the whole copy."""
    return _join(manifest_url(run_url), "base-model.json")


def adapter_config_url(checkpoint: str) -> str:
    """A LoRA checkpoint's `adapter_config.json` (peft's): there only when the checkpoint is an adapter."""
    return _join(checkpoint, ADAPTER_CONFIG)


def adapter_name(version: int | str) -> str:
    """The name a LoRA run's weight version `version` is served under (its adapter, loaded beside the base): new
    with each version, as vLLM keys its prefix cache on the adapter's name and path (steps.proxy.weights).

    >>> adapter_name(3)
    'policy-v3'
    """
    return f"policy-v{version}"


def metrics_url(checkpoint: str) -> str:
    """The update's `metrics.json`, in the checkpoint folder it wrote."""
    return _join(checkpoint, METRICS_FILE)


def manifest_url(run_url: str) -> str:
    """The run manifest's folder."""
    return _join(run_url, "manifest")


def run_config_url(run_url: str) -> str:
    """The run's config as it started (`manifest/run.json`)."""
    return _join(manifest_url(run_url), "run.json")


def datasets_record_url(run_url: str) -> str:
    """Where an Argo run's datasets came from and the content hash of each task (`manifest/datasets.json`)."""
    return _join(manifest_url(run_url), "datasets.json")


def iteration_record_url(run_url: str, iteration: int) -> str:
    """One iteration's record in the manifest (one file each: the driver and Argo's exit handler never
    rewrite each other's iterations)."""
    return _join(manifest_url(run_url), f"iteration-{iteration}.json")


def iteration_records_glob(run_url: str) -> str:
    """A glob matching every iteration record of the manifest."""
    return _join(manifest_url(run_url), "iteration-*.json")


def eval_record_url(run_url: str, iteration: int) -> str:
    """One evaluation's record in the manifest: of the checkpoint iteration `iteration` serves (a training
    run's final checkpoint is `iterations`'s; an eval run's one evaluation is 0)."""
    return _join(manifest_url(run_url), f"eval-{iteration}.json")


def eval_records_glob(run_url: str) -> str:
    """A glob matching every evaluation record of the manifest."""
    return _join(manifest_url(run_url), "eval-*.json")


def logs_url(run_url: str) -> str:
    """The local runner's step logs."""
    return _join(run_url, "logs")


def tracking_url(run_url: str) -> str:
    """The experiment trackers' folder (`steps.tracking`)."""
    return _join(run_url, "tracking")


def tensorboard_url(run_url: str) -> str:
    """TensorBoard's event files when the run's `tensorboard_dir` is empty.

    >>> tensorboard_url("s3://b/runs/demo")
    's3://b/runs/demo/tracking/tensorboard'
    """
    return _join(tracking_url(run_url), "tensorboard")


def reports_url(run_url: str) -> str:
    """The run's reports."""
    return _join(run_url, "reports")


def evals_url(run_url: str) -> str:
    """The folder of every evaluation of the run (an eval run has one; a training run one per `eval_every`)."""
    return _join(run_url, "evals")


def eval_url(run_url: str, iteration: int | str) -> str:
    """One evaluation: of the checkpoint iteration `iteration` serves (an eval run's is 0).

    >>> eval_url("runs/demo", 2)
    'runs/demo/evals/iteration-2'
    """
    return _join(evals_url(run_url), f"iteration-{iteration}")


def eval_plan_url(run_url: str, iteration: int | str) -> str:
    """The folder of an evaluation's plan, in chunks (`plan_chunk_url`)."""
    return _join(eval_url(run_url, iteration), "plan")


def eval_results_url(run_url: str, iteration: int | str) -> str:
    """The folder holding one `<rollout_id>/result.json` per eval rollout attempt."""
    return _join(eval_url(run_url, iteration), "results")


def eval_rollout_url(run_url: str, iteration: int | str, rollout_id: str) -> str:
    """One eval rollout attempt's folder (the rollout step's `--out`)."""
    return _join(eval_results_url(run_url, iteration), rollout_id)


def eval_result_url(run_url: str, iteration: int | str, rollout_id: str) -> str:
    """One eval rollout attempt's `result.json`."""
    return _join(eval_rollout_url(run_url, iteration, rollout_id), RESULT_FILE)


def set_aside_eval_results_url(run_url: str, iteration: int, attempt: int) -> str:
    """Where the local runner moves the eval results of start number `attempt` (0, 1, ...) of an evaluation
    when a later start runs it again.

    >>> set_aside_eval_results_url("runs/demo", 2, 0)
    'runs/demo/evals/iteration-2/results-attempt-0'
    """
    return f"{eval_results_url(run_url, iteration)}-attempt-{attempt}"


def eval_trajectories_url(run_url: str, iteration: int | str) -> str:
    """Where the trajectories step writes an evaluation's tables (a partition `run=<run>/iteration=<N>` below)."""
    return _join(eval_url(run_url, iteration), "trajectories")


def eval_summary_url(run_url: str, iteration: int | str) -> str:
    """An evaluation's `summary.json` (`steps.evaluate`)."""
    return _join(eval_url(run_url, iteration), "summary.json")


def report_index_url(run_url: str) -> str:
    """The run report's front page."""
    return _join(reports_url(run_url), "index.html")


def browsable_url(url: str, store: str, base: str) -> str:
    """`url`, under `store`, as a browser opens it at `base` (an http(s) URL serving the store's root, the
    config's `report_url_base`); its path percent-encoded. `url` itself when there is no base.

    >>> browsable_url("s3://b/runs/my run/reports/index.html", "s3://b/runs/", "https://reports.example.com/runs/")
    'https://reports.example.com/runs/my%20run/reports/index.html'
    >>> browsable_url("s3://b/runs/demo/reports/index.html", "s3://b/runs", "")
    's3://b/runs/demo/reports/index.html'
    """
    root = store.rstrip("/") + "/"
    if not base or not url.startswith(root):
        return url
    return base.rstrip("/") + "/" + quote(url[len(root):])
