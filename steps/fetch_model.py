"""Fetches a model from the Hugging Face Hub into the run's store, once (a run's `model: hf://org/name[@revision]`).

    HF_TOKEN=... python -m steps.fetch_model --model hf://Qwen/Qwen3-8B --run-url s3://openforge/runs/demo

It asks the hub which commit the revision (default `main`) is and which files that commit holds, then streams the
serving and training files (safetensors, JSON configs, tokenizer files; `WANTED`) to the run's `base-model/` in the
store, chunk by chunk (no shard is held in memory), each file retried on a transient error and checked against the
size the hub gave. Last it writes `manifest/base-model.json` (`FetchedModel`: the commit, its files): the mark that
the copy is whole, and the run's pin of what it trains. A run holding that record is not fetched again; an
interrupted fetch, which wrote none, is fetched again from the start.

The routes and headers are the ones `huggingface_hub` 1.33.0's own client uses (the library is not needed here):
`GET {endpoint}/api/models/{repo}/revision/{quote(revision, safe='')}?blobs=true` answers the commit `sha` and its
`siblings` (`rfilename`, `size`) (`HfApi.model_info`, hf_api.py); `GET {endpoint}/{repo}/resolve/{sha}/{file}` the file
(`constants.HUGGINGFACE_CO_URL_TEMPLATE`, `hf_hub_url`), through the redirects the hub answers; the token is sent as
`authorization: Bearer <token>` (`utils/_headers.py`, `build_hf_headers`) and nowhere else. httpx drops that header on
a redirect to another host (httpx `_client.py`, `_redirect_headers`), so the CDN a file is served from never sees it.
Its errors are read as `hf_raise_for_status` (utils/_http.py) reads them: the `X-Error-Code` header says
`RepoNotFound`, `GatedRepo` or `RevisionNotFound`; a 401 is also what a private or unknown repository answers to an
anonymous caller. The same statuses it retries (408, 429, 5xx: `_DEFAULT_RETRY_ON_STATUS_CODES`) are retried here.
"""

import argparse
import fnmatch
import os
import re
import sys
import time
from dataclasses import asdict, dataclass, field
from urllib.parse import quote

import httpx

from steps import manifest
from steps.contracts import layout

DEFAULT_ENDPOINT = "https://huggingface.co"
DEFAULT_REVISION = "main"
TOKEN_ENV = "HF_TOKEN"  # huggingface_hub's own variable; on Argo it comes from the Secret `hub_secret` (key `token`)
# What vLLM serves and the update trains from: the weights, the configs and the tokenizer. Top level only: some repos
# keep a second copy of the weights in another format in a subfolder (`original/`).
WANTED = ("*.safetensors", "*.json", "tokenizer.model", "*.tiktoken", "merges.txt", "vocab.txt", "*.jinja")
RETRIED_STATUS = (408, 429, 500, 502, 503, 504)
ATTEMPTS = 5
CHUNK = 8 * 2**20
PROGRESS_EVERY_S = 10.0
# A hub repository id (huggingface_hub's `validate_repo_id`: word characters, '-' and '.', at most 96 characters, no
# '--' or '..'), here always `org/name`; a revision is a branch, a tag or a commit (a branch may hold '/').
REPO_ID = r"[A-Za-z0-9][\w.-]{0,94}/[A-Za-z0-9][\w.-]{0,94}"
HUB_MODEL = re.compile(rf"(?P<repo>{REPO_ID})(?:@(?P<revision>[\w.][\w./-]*))?")


class HubError(RuntimeError):
    """The hub refused the model or a file of it; the message is one sentence for people."""


@dataclass(frozen=True)
class HubModel:
    """A model on the hub: its repository and the revision asked for."""

    repo: str
    revision: str = DEFAULT_REVISION

    def __str__(self) -> str:
        """The model as a config's `model` names it.

        >>> str(HubModel("Qwen/Qwen3-8B")), str(HubModel("Qwen/Qwen3-8B", "v1.0"))
        ('hf://Qwen/Qwen3-8B', 'hf://Qwen/Qwen3-8B@v1.0')
        """
        return f"{layout.HUB_SCHEME}{self.repo}" + (f"@{self.revision}" if self.revision != DEFAULT_REVISION else "")


def hub_model(text: str) -> HubModel | None:
    """The hub model `text` names (`hf://org/name[@revision]`, or the same without `hf://`), or None when it is
    not one; telling a bare id from a folder that exists is the caller's (`workflows.config`).

    >>> hub_model("hf://Qwen/Qwen3-8B@main"), hub_model("Qwen/Qwen3-8B") == hub_model("hf://Qwen/Qwen3-8B")
    (HubModel(repo='Qwen/Qwen3-8B', revision='main'), True)
    >>> [hub_model(t) for t in ("s3://b/models/q", "/abs/path", "a/b/c", "a--b/c", "Qwen/Qwen3-8B@")]
    [None, None, None, None, None]
    """
    match = HUB_MODEL.fullmatch(text.removeprefix(layout.HUB_SCHEME))
    if match is None or "--" in match["repo"] or ".." in text:
        return None
    return HubModel(match["repo"], match["revision"] or DEFAULT_REVISION)


@dataclass
class FetchedModel:
    """What was fetched (`manifest/base-model.json`): the model asked for, the commit it resolved to, its files."""

    model: str  # as the config names it: hf://org/name[@revision]
    sha: str  # the commit the files are from: the run's pin
    endpoint: str
    files: dict[str, int] = field(default_factory=dict)  # file -> bytes


def wanted(name: str) -> bool:
    """Whether a file of the repository is one serving or training reads.

    >>> [wanted(n) for n in ("model-00001-of-00002.safetensors", "config.json", "original/consolidated.00.pth",
    ...                      "original/params.json", "README.md", "tokenizer.model")]
    [True, True, False, False, False, True]
    """
    return "/" not in name and any(fnmatch.fnmatch(name, pattern) for pattern in WANTED)


def hub_problem(response: httpx.Response, model: HubModel, token: bool) -> str:
    """One sentence for a refusal of the hub (never with the token), read as huggingface_hub reads it."""
    code, status = response.headers.get("X-Error-Code", ""), response.status_code
    if code == "GatedRepo" or status == 403:
        return (f"model {model.repo} is gated: accept its terms on the hub with the account whose token the Secret "
                f"named by hub_secret holds (key token)" + ("" if token else ", and create that Secret"))
    if code == "RevisionNotFound":
        return f"model {model.repo} has no revision {model.revision!r} on the hub (a branch, a tag or a commit)"
    invalid = response.headers.get("X-Error-Message") == "Invalid credentials in Authorization header"
    if status == 401 and token and invalid:
        return "the hub refused the token from the Secret named by hub_secret (invalid credentials)"
    if status in (401, 404):
        hint = "" if token else "; a private or gated model needs a token (the Secret named by config key hub_secret)"
        return f"the hub has no model {model.repo} that can be read (unknown or private){hint}"
    return f"the hub answered {status} for model {model.repo}"


def resolve(client: httpx.Client, endpoint: str, model: HubModel, token: bool,
            backoff_s: float = 1.0) -> tuple[str, dict[str, int | None]]:
    """(the commit `model`'s revision is, the wanted files of that commit with their sizes when the hub gives them)."""
    url = f"{endpoint}/api/models/{model.repo}/revision/{quote(model.revision, safe='')}"
    response = request(client, url, {"blobs": "true"}, backoff_s)
    if response.status_code != 200:
        raise HubError(hub_problem(response, model, token))
    info = response.json()
    files = {s["rfilename"]: s.get("size") for s in info.get("siblings", []) if wanted(s["rfilename"])}
    if not any(name.endswith(".safetensors") for name in files):
        raise HubError(f"model {model.repo} at {info['sha']} has no .safetensors weights, which vLLM and the update "
                       f"read; choose a repository that has them")
    return info["sha"], files


def pause(attempt: int, backoff_s: float) -> None:
    """Waits before try `attempt` + 2: `backoff_s` doubled each time, at most 30 s."""
    time.sleep(min(backoff_s * 2**attempt, 30))


def request(client: httpx.Client, url: str, params: dict | None = None, backoff_s: float = 1.0) -> httpx.Response:
    """A GET (its body read), tried again after a transient failure; the last try's answer, whatever it is."""
    for attempt in range(ATTEMPTS - 1):
        try:
            response = client.get(url, params=params)
            if response.status_code not in RETRIED_STATUS:
                return response
        except httpx.TransportError:
            pass
        pause(attempt, backoff_s)
    return client.get(url, params=params)


class Transient(Exception):
    """A download that may succeed when tried again: a retried status, a body shorter than the hub said."""


def stream_file(client: httpx.Client, url: str, fs, path: str, size: int | None, progress) -> int:
    """Streams one file from `url` to `path` on `fs`, CHUNK bytes at a time; returns its bytes. Raises Transient
    (or httpx.TransportError) for a failure worth another try, HubError for a refusal."""
    written = 0
    with client.stream("GET", url) as response:
        if response.status_code in RETRIED_STATUS:
            raise Transient(f"HTTP {response.status_code}")
        if response.status_code != 200:
            raise HubError(f"the hub refused {url.rsplit('/', 1)[-1]} (HTTP {response.status_code}), which it had "
                           f"listed")
        with fs.open(path, "wb") as out:
            for chunk in response.iter_bytes(CHUNK):
                out.write(chunk)
                written += len(chunk)
                progress(written)
    if size is not None and written != size:
        raise Transient(f"got {written} bytes of {size}")
    return written


def copy_file(client: httpx.Client, url: str, fs, path: str, size: int | None, progress,
              backoff_s: float = 1.0) -> int:
    """`stream_file`, from the start again after a transient failure, ATTEMPTS tries in all."""
    name = url.rsplit("/", 1)[-1]
    for attempt in range(ATTEMPTS):
        try:
            return stream_file(client, url, fs, path, size, progress)
        except (httpx.TransportError, Transient) as exc:
            problem = str(exc) or type(exc).__name__
            if attempt == ATTEMPTS - 1:
                raise HubError(f"{name} could not be fetched in {ATTEMPTS} tries ({problem})") from None
            print(f"fetch-model: {name}: {problem}; trying again", file=sys.stderr, flush=True)
            pause(attempt, backoff_s)
    raise HubError(f"{name} could not be fetched")  # not reached: the last try returned or raised


def remove_strays(fs, root: str, names: set[str]) -> None:
    """Removes what else is in the copy's folder (a fetch cut short of an earlier commit left a shard this one does not
    have), so that no stray shard is served. Only after the copy: a fetch of the same commit running beside this one
    (iterations 0..max_staleness may start together) loses none of its files."""
    fs.invalidate_cache()
    for path in fs.find(root):
        if path[len(root.rstrip("/")) + 1:] not in names:
            fs.rm_file(path)


def read_record(run_url: str) -> FetchedModel | None:
    """The run's record of its fetched model, or None when the run holds no whole copy."""
    stored = manifest.read_json(layout.base_model_record_url(run_url))
    return None if stored is None else FetchedModel(**stored)


def fetch_model(model: HubModel, run_url: str, endpoint: str = DEFAULT_ENDPOINT, token: str | None = None,
                backoff_s: float = 1.0) -> tuple[FetchedModel, bool]:
    """(the record of `model`'s copy in the run, whether it was fetched now): the run's record when it has one
    (nothing fetched), else every wanted file streamed to `layout.base_model_url(run_url)`, the record written last."""
    import fsspec

    if (record := read_record(run_url)) is not None:
        if record.model != str(model):
            raise HubError(f"run {run_url} already holds {record.model} as its base model, not {model}; a run keeps "
                           f"the model it started with (start a new run for another)")
        return record, False
    headers = {"authorization": f"Bearer {token}"} if token else {}
    endpoint = endpoint.rstrip("/")
    with httpx.Client(headers=headers, follow_redirects=True, timeout=httpx.Timeout(60.0, connect=30.0)) as client:
        sha, files = resolve(client, endpoint, model, token is not None, backoff_s)
        fs, root = fsspec.core.url_to_fs(layout.base_model_url(run_url))
        fs.makedirs(root, exist_ok=True)
        total, done, said = sum(size or 0 for size in files.values()), 0, [0.0]

        def progress(written: int) -> None:
            if time.monotonic() - said[0] >= PROGRESS_EVERY_S:
                said[0] = time.monotonic()
                print(f"fetch-model: {(done + written) / 1e6:.0f}/{total / 1e6:.0f} MB", file=sys.stderr, flush=True)

        fetched = {}
        for number, (name, size) in enumerate(sorted(files.items()), 1):
            url = f"{endpoint}/{model.repo}/resolve/{sha}/{quote(name)}"
            fetched[name] = copy_file(client, url, fs, f"{root.rstrip('/')}/{name}", size, progress, backoff_s)
            done += fetched[name]
            print(f"fetch-model: {number}/{len(files)} files, {done / 1e6:.0f}/{total / 1e6:.0f} MB: {name}",
                  file=sys.stderr, flush=True)
    remove_strays(fs, root, set(fetched))
    record = FetchedModel(str(model), sha, endpoint, fetched)
    manifest.write_json(layout.base_model_record_url(run_url), asdict(record))
    return record, True


def main(argv: list[str] | None = None) -> int:
    """Fetches the model into the run (or finds it there); exit code 1 with one sentence when the hub refuses."""
    parser = argparse.ArgumentParser(prog="python -m steps.fetch_model", description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True, help="hf://org/name[@revision]")
    parser.add_argument("--run-url", required=True, help="the run's folder or URL in the store")
    parser.add_argument("--endpoint", default=DEFAULT_ENDPOINT, help="the hub's base URL")
    args = parser.parse_args(argv)
    model = hub_model(args.model)
    if model is None:
        print(f"error: --model must be hf://org/name[@revision], got {args.model!r}", file=sys.stderr)
        return 2
    try:
        record, fetched = fetch_model(model, args.run_url, args.endpoint, os.environ.get(TOKEN_ENV) or None)
    except HubError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except httpx.HTTPError as exc:  # the hub could not be reached after the retries
        print(f"error: the hub at {args.endpoint} could not be reached ({type(exc).__name__})", file=sys.stderr)
        return 1
    what = "fetched" if fetched else "already in the run, not fetched again"
    print(f"fetch-model: {record.model} at commit {record.sha}: {what} ({layout.base_model_url(args.run_url)})",
          file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
