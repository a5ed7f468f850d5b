"""A LoRA run's serve pods on Argo fetch the base model once into a cache they share (`model_cache_volume`,
`steps.model_cache`), then only each iteration's adapter.

Through S3 on loopback (moto): a run's base (the tiny model) and two adapter checkpoints as the update writes them
(adapter, `optimizer/`, `metrics.json`); each "pod" is `steps.serve.fetch_served` with a fresh model folder, the
cache shared. The bytes are the store layer's own counts (`steps.checkpoint.IO`). The first pod downloads the base
and its adapter, the next only its adapter; without the cache (the control) every pod downloads the base. A cache
folder that is not whole (a truncated file, no manifest, a download under way) is never used, a base rewritten at
the same URL (before or during a fetch) is fetched again, and two pods fetching at once both get one whole folder.
No vLLM is started. Also the render: the serve pod mounts the claim and passes `--model-cache` only where the key is
set (Argo's strict schema).
"""

import json
import re
from dataclasses import fields
from pathlib import Path

import pytest

from steps import serve
from steps.checkpoint import IO, publish
from steps.contracts import layout
from steps.model_cache import MANIFEST, PARTIAL, fetch_base
from test_lora_serving import RANK, local_bytes, write_adapter
from test_workflows import cluster_config, schema_errors, workflow_validator  # noqa: F401 (a fixture)
from workflows.config import ConfigError, load_config
from workflows.iteration import MODEL_CACHE, iteration_workflow
from workflows.lint import semantic_problems

WEIGHTS = "model.safetensors"


@pytest.fixture
def lora_run(s3_server, monkeypatch, tiny_model, tmp_path) -> dict:
    """A LoRA run in S3: the base where the run keeps it, two adapter checkpoints; the URLs and the adapter's bytes."""
    for key, value in s3_server["env"].items():
        monkeypatch.setenv(key, value)
    import fsspec

    fsspec.filesystem("s3").put(f"{tiny_model}/", f"s3://{s3_server['bucket']}/lora-run/base-model/", recursive=True)
    run = f"s3://{s3_server['bucket']}/lora-run"
    base = f"{run}/base-model"
    for version in (1, 2):
        local = write_adapter(tmp_path / f"written-{version}", tiny_model, seed=version)
        (local / "optimizer").mkdir()
        (local / "optimizer" / "optim_world_size_1_rank_0.pt").write_bytes(b"\0" * 1000)
        (local / "metrics.json").write_text("{}")
        publish(local, layout.checkpoint_url(run, version, base))
    adapter = local_bytes(tmp_path / "written-1") - local_bytes(tmp_path / "written-1" / "optimizer") - 2
    return {"run": run, "base": base, "adapter_bytes": adapter, "base_bytes": local_bytes(tiny_model)}


def pod(lora_run: dict, folder: Path, version: int, cache: Path | None) -> tuple[Path, Path, int]:
    """One serve pod's fetch of iteration `version`'s adapter (a fresh `folder`, as an emptyDir is): the base folder
    vLLM starts on, the adapter folder, and the bytes it downloaded (the store layer's count)."""
    argv = ["--model", layout.checkpoint_url(lora_run["run"], version, lora_run["base"]), "--model-dir",
            str(folder / "current"), "--model-name", "tiny", "--port", "1", "--store", "x",
            "--lora-rank", str(RANK), "--base-model", lora_run["base"],
            *(["--model-cache", str(cache)] if cache is not None else [])]
    for field in fields(IO):
        setattr(IO, field.name, 0)
    model, adapter = serve.fetch_served(serve.parse_args(argv))
    return Path(model), Path(adapter), IO.read_bytes


def test_the_first_pod_fetches_the_base_into_the_cache_and_the_next_only_its_adapter(lora_run, tiny_model, tmp_path):
    """Two iterations' pods with one cache: the base is downloaded once; the control, two pods without it, twice."""
    cache = tmp_path / "cache"
    base_1, adapter_1, read_1 = pod(lora_run, tmp_path / "pod-1", 1, cache)
    base_2, adapter_2, read_2 = pod(lora_run, tmp_path / "pod-2", 2, cache)
    full, adapter = lora_run["base_bytes"], lora_run["adapter_bytes"]
    assert read_1 == full + adapter and read_2 == adapter, (read_1, read_2, full, adapter)
    assert base_1 == base_2 and base_1.parent == cache and (base_1 / MANIFEST).is_file()
    assert adapter_1 == tmp_path / "pod-1" / "current" and adapter_2 == tmp_path / "pod-2" / "current"
    assert (base_1 / WEIGHTS).read_bytes() == (tiny_model / WEIGHTS).read_bytes()
    assert sorted(p.name for p in cache.iterdir()) == [base_1.name]  # nothing half-written left behind
    print(f"per pod with the cache: {read_1}, then {read_2} bytes")

    reads = [pod(lora_run, tmp_path / f"uncached-{n}", n, None)[2] for n in (1, 2)]
    assert reads == [full + adapter, full + adapter], reads  # the control: each pod downloads the base again
    print(f"per pod without it: {reads} bytes")


@pytest.mark.parametrize("damage", ["truncated", "no manifest", "partial"])
def test_a_cache_folder_that_is_not_whole_is_never_used(lora_run, tiny_model, tmp_path, damage):
    """A folder under the base's name with a truncated weight file, or without its manifest, is fetched anew (its
    files replaced); a download under way in the cache (`.partial-...`) is not taken for the base either."""
    cache = tmp_path / "cache"
    base, _, _ = pod(lora_run, tmp_path / "pod-1", 1, cache)
    if damage == "truncated":
        (base / WEIGHTS).write_bytes((base / WEIGHTS).read_bytes()[:1000])
    elif damage == "no manifest":
        (base / MANIFEST).unlink()
    else:  # a pod killed during its download: the folder it was filling, and no whole one
        base.rename(cache / f"{PARTIAL}{base.name}-killed")
    again, _, read = pod(lora_run, tmp_path / "pod-2", 2, cache)
    assert again == base and read == lora_run["base_bytes"] + lora_run["adapter_bytes"], read
    assert (again / WEIGHTS).read_bytes() == (tiny_model / WEIGHTS).read_bytes()
    _, _, read = pod(lora_run, tmp_path / "pod-3", 1, cache)
    assert read == lora_run["adapter_bytes"]  # and once whole again, it is used


def test_a_base_rewritten_at_the_same_url_is_fetched_again(lora_run, tiny_model, tmp_path):
    """The base's weights rewritten in place with other bytes of the same size: the next pod downloads it again into
    a folder of its own and serves the new weights, never the cached old ones."""
    import fsspec

    cache = tmp_path / "cache"
    old, _, _ = pod(lora_run, tmp_path / "pod-1", 1, cache)
    changed = bytearray((tiny_model / WEIGHTS).read_bytes())
    changed[-100:] = bytes(100)  # the last weights zeroed: the same size, other content (another ETag)
    assert bytes(changed) != (tiny_model / WEIGHTS).read_bytes()
    with fsspec.open(f"{lora_run['base']}/{WEIGHTS}", "wb") as out:
        out.write(bytes(changed))
    new, _, read = pod(lora_run, tmp_path / "pod-2", 2, cache)
    assert new != old and read == lora_run["base_bytes"] + lora_run["adapter_bytes"], read
    assert (new / WEIGHTS).read_bytes() == bytes(changed)
    assert (old / WEIGHTS).read_bytes() == (tiny_model / WEIGHTS).read_bytes()  # the old one untouched


def test_a_base_rewritten_during_its_fetch_is_thrown_away(lora_run, tiny_model, tmp_path, monkeypatch):
    """The base's weights rewritten while a pod downloads it: the download is not renamed into place (it may hold old
    and new files), the fetch fails with one sentence, and the cache holds nothing; the next fetch takes the new base."""
    import fsspec

    from steps import model_cache

    cache, real_download = tmp_path / "cache", model_cache.download

    def rewritten_meanwhile(url, local, *args):
        count = real_download(url, local, *args)
        with fsspec.open(f"{lora_run['base']}/{WEIGHTS}", "wb") as out:
            out.write(bytes((tiny_model / WEIGHTS).stat().st_size))
        return count

    monkeypatch.setattr(model_cache, "download", rewritten_meanwhile)
    with pytest.raises(OSError, match="changed while it was fetched"):
        fetch_base(lora_run["base"], cache, ("optimizer", "metrics.json"))
    assert list(cache.iterdir()) == []
    monkeypatch.setattr(model_cache, "download", real_download)
    base = fetch_base(lora_run["base"], cache, ("optimizer", "metrics.json"))
    assert (base / WEIGHTS).read_bytes() == bytes((tiny_model / WEIGHTS).stat().st_size)


def test_two_pods_fetching_the_base_at_once_both_get_one_whole_folder(lora_run, tiny_model, tmp_path, monkeypatch):
    """Two fetches of the base into one cache at once (two runs' pods, or a retried one), made to interleave: the
    second pod starts and finishes its fetch while the first is downloading. The second's rename wins; the first's
    then fails, and it uses that folder and removes its own download. Both serve the whole base; no partial is left."""
    from steps import model_cache

    cache, skip, inner, started = tmp_path / "cache", ("optimizer", "metrics.json"), [], []
    real_download = model_cache.download

    def interleaved(url, local, *args):
        if not started:  # the first pod's download: the second pod fetches the whole base meanwhile
            started.append(local)
            inner.append(model_cache.fetch_base(url, cache, skip))
        return real_download(url, local, *args)

    monkeypatch.setattr(model_cache, "download", interleaved)
    outer = fetch_base(lora_run["base"], cache, skip)
    assert inner == [outer], (inner, outer)
    assert sorted(p.name for p in cache.iterdir()) == [outer.name]
    assert (outer / WEIGHTS).read_bytes() == (tiny_model / WEIGHTS).read_bytes()
    assert json.loads((outer / MANIFEST).read_text())["url"] == lora_run["base"]


def test_the_serve_pod_mounts_the_claim_only_where_the_key_is_set(workflow_validator):  # noqa: F811
    """A LoRA run with `model_cache_volume`: iteration 1's serve pod mounts the claim at MODEL_CACHE and passes it as
    `--model-cache`; the Workflow passes Argo's strict schema and the lint. Without the key (the control) neither."""
    config = cluster_config("run=golden", "iterations=2", "lora_rank=8", "model_cache_volume=openforge-models")
    workflow = iteration_workflow(config, 1).to_dict()
    assert schema_errors(workflow_validator, workflow) == [] and semantic_problems(workflow) == []
    [template] = [t for t in workflow["spec"]["templates"] if t["name"] == "serve"]
    assert {"name": "model-cache", "persistentVolumeClaim": {"claimName": "openforge-models"}} in template["volumes"]
    assert {"name": "model-cache", "mountPath": MODEL_CACHE} in template["container"]["volumeMounts"]
    command = template["container"]["command"]
    assert command[command.index("--model-cache") + 1] == MODEL_CACHE
    plain = str(iteration_workflow(cluster_config("run=golden", "iterations=2", "lora_rank=8"), 1).to_dict())
    assert "--model-cache" not in plain and "persistentVolumeClaim" not in plain


@pytest.mark.parametrize("overrides, message", [
    (["lora_rank=8", "model_cache_volume=Models_1"], "config key 'model_cache_volume' must be a "
                                                      "PersistentVolumeClaim's name (a DNS-1123 subdomain"),
    (["model_cache_volume=openforge-models"], "config key 'model_cache_volume' caches a LoRA run's base model"),
])
def test_a_cache_key_that_cannot_be_used_is_refused_in_one_sentence(overrides, message):
    """A claim's name that is no DNS-1123 subdomain, and the key in a full-weight run (which would not use it)."""
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_config(None, overrides, check_dataset=False)
    load_config(None, ["lora_rank=8", "model_cache_volume=openforge-models"], check_dataset=False)  # the control
