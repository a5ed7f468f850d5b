"""Export a run's checkpoint as a standard Hugging Face folder (or a hub repo).

    python -m steps.export --run R --iteration N --out DIR|s3://... [--merge] [--push-to-hub REPO] \\
        [--dtype bf16|fp16|fp32] [--max-shard-size 5GB] [--force]
    python -m steps.export --checkpoint DIR_OR_URL --out DIR|s3://... [...]

`R` is the run's folder or `s3://` URL: its manifest (`manifest/run.json`) names the base model, and iteration N's
checkpoint is `steps.contracts.layout.checkpoint_url` (iteration 0: the base model). The folder written holds the
weights in `--dtype` as sharded safetensors (`model-0000k-of-0000N.safetensors` + `model.safetensors.index.json`,
converted tensor by tensor: one shard at most is in memory), `config.json` with that dtype, the tokenizer and chat
template, `generation_config.json` (the checkpoint's, else one from the run's sampling) and a model card
(`README.md`: run, iteration, base model, the update's metrics); never `optimizer/` or `metrics.json`. A LoRA
checkpoint (peft's `adapter_config.json` + `adapter_model.safetensors`) is exported as that adapter, or with
`--merge` merged into its base (the run's iteration 0): W + (alpha / r) B A per target module, in fp32, with torch
alone. `--push-to-hub REPO` uploads the folder with huggingface_hub (`HF_TOKEN`). Bad input is one sentence, exit 2.
"""

import argparse
import json
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from steps import manifest
from steps.checkpoint import OPTIMIZER_DIR, TRAINING_ONLY, fetch, is_remote, publish
from steps.contracts import layout
from steps.update.skip import CHECKPOINT_FILES

DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}  # --dtype: torch's name of each
INDEX_FILE = "model.safetensors.index.json"
ADAPTER_CONFIG, ADAPTER_WEIGHTS = "adapter_config.json", "adapter_model.safetensors"
# What an export leaves out of a checkpoint; the weights, config and card are written, not copied.
NOT_COPIED = {"config.json", "generation_config.json"}
SIZE_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30}


class ExportError(ValueError):
    """An export that cannot be done as asked: the message names the argument and what is accepted."""


def parse_size(text: str) -> int:
    """Bytes in a size such as `5GB` (10**9, as huggingface_hub counts) or `500MiB`.

    >>> parse_size("5GB"), parse_size("2MiB"), parse_size("1000")
    (5000000000, 2097152, 1000)
    """
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", text)
    if not match or match.group(2).upper() not in SIZE_UNITS or float(match.group(1)) <= 0:
        raise ExportError(f"--max-shard-size {text!r} is not a size; give a number with KB, MB, GB, KiB, MiB or GiB")
    return int(float(match.group(1)) * SIZE_UNITS[match.group(2).upper()])


def resolve(run: str | None, iteration: int | None, checkpoint: str | None) -> tuple[str, str | None, dict]:
    """(the checkpoint's URL, its base model's URL for an adapter, the run's recorded config or {}), refused in one
    sentence when the run has no manifest, no such iteration or an unfinished checkpoint."""
    if checkpoint:
        return checkpoint, None, {}
    if run is None or iteration is None:
        raise ExportError("give --run and --iteration (or --checkpoint DIR_OR_URL)")
    config = manifest.read_run_config(run)
    if config is None or "model" not in config:
        raise ExportError(f"--run {run}: no run manifest there ({layout.run_config_url(run)}); give a run folder")
    url = layout.checkpoint_url(run, iteration, config["model"])
    if iteration > 0 and not _exists(layout.metrics_url(url)):
        if not _exists(url):
            raise ExportError(f"--iteration {iteration}: run {run} has no such iteration (nothing at {url})")
        raise ExportError(f"--iteration {iteration}: {url} has no metrics.json, so its update has not finished; "
                          "export a finished iteration")
    return url, layout.checkpoint_url(run, 0, config["model"]), config


def _exists(url: str) -> bool:
    import fsspec

    fs, path = fsspec.core.url_to_fs(url)
    return fs.exists(path)


def check_out(out: str, force: bool) -> None:
    """Refuses an `--out` that already holds files, unless `force` (then its old weights are removed, so no stale
    shard of a larger export is left beside the new index)."""
    import fsspec

    fs, path = fsspec.core.url_to_fs(out)
    found = fs.find(path) if fs.exists(path) else []
    if found and not force:
        raise ExportError(f"--out {out} is not empty ({len(found)} files); give an empty folder or --force")
    for name in found:
        if name.endswith(".safetensors") or name.endswith(INDEX_FILE):
            fs.rm_file(name)


def weight_files(folder: Path) -> list[Path]:
    """The checkpoint's safetensors files: those its index names, else every `*.safetensors` (the single-file
    layout); an adapter's are not weights."""
    index = folder / INDEX_FILE
    if index.is_file():
        return [folder / name for name in sorted(set(json.loads(index.read_text())["weight_map"].values()))]
    files = sorted(path for path in folder.glob("*.safetensors") if path.name != ADAPTER_WEIGHTS)
    if not files:
        raise ExportError(f"{folder}: no safetensors weights there; give a Hugging Face model folder")
    return files


def tensors(files: list[Path], dtype) -> Iterator[tuple[str, "object"]]:
    """Each tensor of `files`, one at a time (safetensors' `safe_open` reads only it), floating ones cast to
    `dtype`."""
    from safetensors import safe_open

    for path in files:
        with safe_open(str(path), framework="pt") as handle:
            for name in handle.keys():
                tensor = handle.get_tensor(name)
                yield name, tensor.to(dtype) if tensor.is_floating_point() else tensor


def write_shards(named: Iterator[tuple[str, "object"]], out: Path, max_shard_bytes: int) -> dict:
    """Writes `named` tensors as `model-0000k-of-0000N.safetensors` shards of at most `max_shard_bytes` (a larger
    tensor is a shard alone) plus the index; returns the index. One shard is in memory at a time."""
    from safetensors.torch import save_file

    shards: list[list[str]] = []
    current: dict = {}
    size = total = 0

    def flush() -> None:
        save_file(current, str(out / f".shard-{len(shards) + 1}.partial"), metadata={"format": "pt"})
        shards.append(list(current))
        current.clear()

    try:
        for name, tensor in named:
            nbytes = tensor.numel() * tensor.element_size()
            if current and size + nbytes > max_shard_bytes:
                flush()
                size = 0
            current[name] = tensor.contiguous()
            size, total = size + nbytes, total + nbytes
        if current:
            flush()
    except BaseException:  # a refused merge, a full disk: no partial shard is left behind
        for partial in out.glob(".shard-*.partial"):
            partial.unlink()
        raise
    weight_map = {}
    for number, names in enumerate(shards, 1):
        shard = f"model-{number:05d}-of-{len(shards):05d}.safetensors"
        os.replace(out / f".shard-{number}.partial", out / shard)
        weight_map.update(dict.fromkeys(names, shard))
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (out / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n")
    return index


def merged(base: Iterator[tuple[str, "object"]], adapter: Path, dtype) -> Iterator[tuple[str, "object"]]:
    """`base`'s tensors with the LoRA adapter folder `adapter` merged in: W + scale * B @ A (in fp32, then `dtype`)
    for each target module, scale = lora_alpha / r (/ sqrt(r) with rsLoRA), as peft's `merge_and_unload` does
    (`peft/tuners/lora/layer.py`, `Linear.get_delta_weight`); an adapter peft could not merge that way is refused."""
    import torch
    from safetensors.torch import load_file

    config = json.loads((adapter / ADAPTER_CONFIG).read_text())
    for key in ("use_dora", "lora_bias", "rank_pattern", "alpha_pattern"):
        if config.get(key):
            raise ExportError(f"{adapter / ADAPTER_CONFIG}: {key} is set; --merge merges plain LoRA only "
                              "(export the adapter without --merge)")
    rank = config["r"]
    scale = config["lora_alpha"] / (rank ** 0.5 if config.get("use_rslora") else rank)
    pairs: dict[str, dict] = {}
    for key, value in load_file(str(adapter / ADAPTER_WEIGHTS)).items():
        match = re.fullmatch(r"base_model\.model\.(.+)\.lora_([AB])(?:\.[^.]+)?\.weight", key)
        if match is None:
            raise ExportError(f"{adapter / ADAPTER_WEIGHTS}: {key} is not a LoRA A or B weight; --merge merges "
                              "plain LoRA only")
        pairs.setdefault(f"{match.group(1)}.weight", {})[match.group(2)] = value.float()
    for name, tensor in base:
        pair = pairs.pop(name, None)
        if pair is not None:
            delta = scale * (pair["B"] @ pair["A"])
            tensor = tensor.float() + (delta.T if config.get("fan_in_fan_out") else delta)
        yield name, tensor.to(dtype) if tensor.is_floating_point() else tensor
    if pairs:
        raise ExportError(f"{adapter / ADAPTER_WEIGHTS}: no base weight for {', '.join(sorted(pairs))}; the "
                          "adapter does not belong to this base model")


def model_config(checkpoint: Path, dtype_name: str) -> dict:
    """The checkpoint's `config.json` with the exported dtype (`dtype`, transformers 5's name, and `torch_dtype`,
    the older one)."""
    config = json.loads((checkpoint / "config.json").read_text())
    return {**config, "dtype": dtype_name, "torch_dtype": dtype_name}


def generation_config(checkpoint: Path, config: dict, run_config: dict) -> dict:
    """The checkpoint's `generation_config.json`, else one with the model's special tokens (as transformers'
    `GenerationConfig.from_model_config` takes them) and the run's sampling (`temperature`, `top_p`) when known."""
    path = checkpoint / "generation_config.json"
    if path.is_file():
        return json.loads(path.read_text())
    tokens = {key: config[key] for key in ("bos_token_id", "eos_token_id", "pad_token_id") if config.get(key) is not None}
    sampling = {key: run_config[key] for key in ("temperature", "top_p") if key in run_config}
    return {**tokens, **({"do_sample": True, **sampling} if sampling else {})}


def model_card(run: str | None, iteration: int | None, checkpoint: str, base: str, metrics: dict | None,
               adapter: bool, dtype: str) -> str:
    """The exported folder's `README.md`: where it came from (run, iteration, checkpoint, base model) and the
    metrics of the update that wrote it."""
    hub = base.removeprefix(layout.HUB_SCHEME).split("@")[0] if base.startswith(layout.HUB_SCHEME) else ""
    front = ["---", f"library_name: {'peft' if adapter else 'transformers'}", *([f"base_model: {hub}"] if hub else []),
             "tags:", "- openforge", "- reinforcement-learning", "---", ""]
    title = f"{Path(run.rstrip('/')).name} iteration {iteration}" if run else Path(checkpoint.rstrip("/")).name
    lines = [f"# {title}", "", "Trained with OpenForge (reinforcement learning inside the agent's real harness) and "
             "exported with `python -m steps.export`.", "",
             *([f"- Run: `{run}`", f"- Iteration: {iteration}"] if run else []), f"- Checkpoint: `{checkpoint}`",
             f"- Base model: `{base}`", f"- {'LoRA adapter (peft format)' if adapter else f'Weights: {dtype}'}", ""]
    if metrics:
        lines += ["## Metrics of the update that wrote this checkpoint", "", "| metric | value |", "|---|---|"]
        lines += [f"| {key} | {value} |" for key, value in metrics.items() if not isinstance(value, dict | list)]
    else:
        lines += ["No update metrics: this is the base model (iteration 0)."]
    return "\n".join(front + lines) + "\n"


def read_metrics(checkpoint: str) -> dict | None:
    """The checkpoint's `metrics.json` (the update's), or None (a base model)."""
    return manifest.read_json(layout.metrics_url(checkpoint))


def export(checkpoint_url: str, out: Path, dtype: str = "bf16", max_shard_bytes: int = 5 * 10**9,
           merge: bool = False, base_url: str | None = None, run_config: dict | None = None,
           run: str | None = None, iteration: int | None = None, work: Path | None = None) -> Path:
    """Writes the Hugging Face folder of `checkpoint_url` into the empty local folder `out` (see the module's
    docstring); `base_url` is an adapter's base (default: its `base_model_name_or_path`), `work` a scratch folder
    for remote inputs."""
    import torch

    torch_dtype = getattr(torch, DTYPES[dtype])
    work = Path(work or tempfile.mkdtemp(prefix="openforge-export-"))
    checkpoint = fetch(checkpoint_url, work / "checkpoint", skip=TRAINING_ONLY)
    if (checkpoint / OPTIMIZER_DIR).is_dir() and not (checkpoint / layout.METRICS_FILE).is_file():
        raise ExportError(f"--checkpoint {checkpoint_url} has optimizer/ but no metrics.json, so its update has not "
                          "finished; export a finished checkpoint")
    adapter = (checkpoint / ADAPTER_CONFIG).is_file()
    base_url = base_url or (json.loads((checkpoint / ADAPTER_CONFIG).read_text())["base_model_name_or_path"]
                            if adapter else (run_config or {}).get("model"))
    if adapter and merge and (not base_url or base_url.startswith(layout.HUB_SCHEME)):
        raise ExportError(f"--merge: the adapter's base {base_url!r} is not a folder or URL this can read; give "
                          "--run and --iteration, whose iteration 0 is the base's copy")
    out.mkdir(parents=True, exist_ok=True)
    source = checkpoint
    if adapter and merge:
        source = fetch(base_url, work / "base", skip=TRAINING_ONLY)
        write_shards(merged(tensors(weight_files(source), torch.float32), checkpoint, torch_dtype), out,
                     max_shard_bytes)
    elif adapter:
        shutil.copyfile(checkpoint / ADAPTER_CONFIG, out / ADAPTER_CONFIG)
        shutil.copyfile(checkpoint / ADAPTER_WEIGHTS, out / ADAPTER_WEIGHTS)
    else:
        write_shards(tensors(weight_files(checkpoint), torch_dtype), out, max_shard_bytes)
    for name in CHECKPOINT_FILES:  # tokenizer, chat template, processor files: from the checkpoint, else its base
        found = checkpoint / name if (checkpoint / name).is_file() else source / name
        if name not in NOT_COPIED and found.is_file():
            shutil.copyfile(found, out / name)
    if not adapter or merge:
        config = model_config(source, DTYPES[dtype])
        (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        generation = generation_config(source if merge else checkpoint, config, run_config or {})
        (out / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
    card = model_card(run, iteration, checkpoint_url, base_url or "not recorded (exported with --checkpoint)",
                      read_metrics(checkpoint_url), adapter and not merge, DTYPES[dtype])
    (out / "README.md").write_text(card)
    return out


def push_to_hub(folder: Path, repo: str, api=None, token: str | None = None) -> str:
    """Uploads `folder` to the hub model repo `repo` (created if missing) with huggingface_hub's `HfApi`
    (`create_repo`, `upload_folder`), or with `api`, an object with those two methods. Returns the repo's URL."""
    if api is None:
        from huggingface_hub import HfApi

        api = HfApi(token=token or os.environ.get("HF_TOKEN"))
    url = api.create_repo(repo_id=repo, repo_type="model", exist_ok=True)
    api.upload_folder(repo_id=repo, repo_type="model", folder_path=str(folder),
                      commit_message=f"Export {folder.name} with OpenForge (python -m steps.export)")
    return str(url)


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The CLI."""
    parser = argparse.ArgumentParser(prog="python -m steps.export", description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", help="the run's folder or s3:// URL (its manifest names the base model)")
    parser.add_argument("--iteration", type=int, help="the iteration whose checkpoint to export (0: the base)")
    parser.add_argument("--checkpoint", help="a checkpoint folder or URL, instead of --run and --iteration")
    parser.add_argument("--out", required=True, help="an empty folder or s3:// URL for the Hugging Face folder")
    parser.add_argument("--merge", action="store_true", help="merge a LoRA adapter into its base model")
    parser.add_argument("--dtype", choices=list(DTYPES), default="bf16", help="the weights' dtype (default bf16)")
    parser.add_argument("--max-shard-size", default="5GB", help="the largest safetensors shard (default 5GB)")
    parser.add_argument("--push-to-hub", metavar="REPO", help="also upload the folder to this hub model repo "
                        "(token: HF_TOKEN)")
    parser.add_argument("--force", action="store_true", help="write into an --out that is not empty")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Export, then push if asked; exit code 2 with one sentence on bad input."""
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        max_shard_bytes = parse_size(args.max_shard_size)
        checkpoint, base, run_config = resolve(args.run, args.iteration, args.checkpoint)
        check_out(args.out, args.force)
        with tempfile.TemporaryDirectory(prefix="openforge-export-") as tmp:
            out = Path(tmp) / "out" if is_remote(args.out) else Path(args.out)
            export(checkpoint, out, args.dtype, max_shard_bytes, args.merge, base, run_config, args.run,
                   args.iteration, Path(tmp) / "in")
            if is_remote(args.out):
                publish(out, args.out)
            if args.push_to_hub:
                print(f"steps.export: pushed to {push_to_hub(out, args.push_to_hub)}", file=sys.stderr)
    except (ExportError, FileNotFoundError) as error:
        print(f"steps.export: {error}", file=sys.stderr)
        return 2
    print(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
