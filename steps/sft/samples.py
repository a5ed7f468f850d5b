"""SFT samples from a run's recordings: the rollouts a run or an evaluation recorded through the proxy, kept by
reward (rejection sampling) and laid out for the student model, the assistant's turns alone trained.

    python -m steps.sft.samples --source STORE/RUN --model STUDENT --out SAMPLES_URL [--min-reward 1.0]

Each rollout of the source (every iteration's results, or an evaluation's) whose reward is at least `--min-reward`
gives its recorded calls (the proxy's store, `<source>/calls`) as samples of the `samples` table's schema
(`steps.contracts.tables.SampleRow`, so the training step reads them as the update does):

- **token-exact** (`exact`) when the recordings were served by a checkpoint whose tokenizer and chat template are
  the student's: the recorded prompt and sampled ids, merged into samples as the trajectories step merges them
  (`steps.trajectories.samples.build_samples`), `response_mask` 1 on the sampled ids alone;
- **rendered** (`rendered`) otherwise (another model, an `--upstream` server): each call's conversation as the
  recorder was sent it (the proxy's own dialect conversion, `to_upstream`, so every dialect reads alike) and its
  answer as an assistant message, rendered with the student's chat template and tools; the assistant message's
  tokens (through its end-of-turn token) are the call's response, and the calls are merged the same way, so a
  later call's prompt that continues an earlier sample extends it with mask 0.

stdout: one JSON object (`SftSamples`'s fields): the mode and why, the rollouts kept and left out by reward, the
samples, the trained tokens, and the calls left out with why. Exit code 2, one sentence, when the source has no
results or no rollout reaches `--min-reward`.
"""

import argparse
import json
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

import fsspec
import orjson
import pyarrow as pa

from steps import manifest
from steps.contracts import layout
from steps.contracts.calls import CallRecord
from steps.contracts.rollout import RolloutResult
from steps.contracts.table_files import write_table
from steps.contracts.tables import SAMPLES, SampleRow
from steps.proxy import chat, messages, responses
from steps.proxy.protocol import decode, plain
from steps.trajectories.collect import CollectError, fetch_calls_store, load_results
from steps.trajectories.samples import build_samples

EXACT, RENDERED = "exact", "rendered"
# The results a rollout must have ended with to be trained on: graded, whatever its reward.
GRADED = ("ok", "agent_timeout", "agent_killed")
# What two tokenizers must share for recorded ids to mean the same text to the student.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "chat_template.json")


class SftError(ValueError):
    """The source cannot give SFT samples: the message names what and where."""


@dataclass
class SftSamples:
    """What the builder made, and of what: printed as one JSON line and kept beside the samples."""

    source: str
    mode: str
    why: str
    min_reward: float
    rollouts: int = 0  # graded rollouts in the source
    kept_rollouts: int = 0  # of those, reward >= min_reward
    samples: int = 0
    trained_tokens: int = 0
    left_out: list[dict] = field(default_factory=list)  # {"rollout_id", "call_index", "why"}


def source_results(run_url: str) -> list[RolloutResult]:
    """Every result of the source run: an evaluation's (eval run) and each training iteration's."""
    fs, pattern = fsspec.core.url_to_fs(layout.results_url(run_url, "*"))
    protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
    found = sorted(path if protocol in ("file", "local") else f"{protocol}://{path}" for path in fs.glob(pattern))
    folders = [layout.eval_results_url(run_url, 0)] + found
    results = []
    for folder in folders:
        try:
            results += load_results(folder)
        except CollectError:  # a folder without results: the source has none there
            continue
    if not results:
        raise SftError(f"--source {run_url} has no rollout results (neither an evaluation's nor an iteration's)")
    return results


def kept(results: list[RolloutResult], min_reward: float) -> list[RolloutResult]:
    """The graded rollouts whose reward reaches `min_reward` (rejection sampling).

    >>> r = lambda i, status, reward: RolloutResult(rollout_id=i, task="t", harness="direct", status=status,
    ...                                             reward=reward)
    >>> [x.rollout_id for x in kept([r("a", "ok", 1.0), r("b", "ok", 0.0), r("c", "infra_error", None)], 1.0)]
    ['a']
    """
    return [r for r in results if r.status in GRADED and r.reward is not None and r.reward >= min_reward]


def same_tokenizer(recorder: str | None, student: str) -> tuple[bool, str]:
    """Whether ids recorded from the `recorder` checkpoint (a folder or URL; None: an upstream server, whose
    tokenizer is unknown) are the student's: every tokenizer file of theirs alike. Returns (same, why)."""
    if not recorder:
        return False, "the recordings came from an upstream server, whose tokenizer is unknown"

    def files(url: str) -> dict[str, bytes]:
        fs, root = fsspec.core.url_to_fs(url)
        return {name: fs.cat_file(f"{root.rstrip('/')}/{name}") for name in TOKENIZER_FILES
                if fs.exists(f"{root.rstrip('/')}/{name}")}

    try:
        theirs, ours = files(recorder), files(student)
    except OSError as error:
        return False, f"the recorder's tokenizer ({recorder}) cannot be read ({error})"
    if not theirs or theirs != ours:
        return False, f"the recorder's tokenizer or chat template ({recorder}) is not the student's"
    return True, f"the recorder ({recorder}) has the student's tokenizer and chat template"


def recorder_of(run_url: str) -> str | None:
    """The checkpoint that served the source's recordings, None for an upstream server: an eval run's run.json
    `eval` names it (its `upstream`, else `checkpoint`), a training run's base model's tokenizer is every
    iteration's (`layout.checkpoint_url` of iteration 0)."""
    stored = manifest.read_run_config(run_url)
    if stored is None:
        raise SftError(f"--source {run_url} is not a run (no {layout.run_config_url(run_url)})")
    evaluates = manifest.read_evaluates(run_url)
    if evaluates is not None:
        return None if evaluates.get("upstream") else evaluates.get("checkpoint")
    return layout.checkpoint_url(run_url, 0, stored["model"])


def chat_body(record: CallRecord) -> dict:
    """The chat body the recorder was sent for this call (`messages`, `tools`): the proxy's own conversion of the
    harness's request in its dialect (`to_upstream`)."""
    dialect = {module.NAME: module for module in (chat, responses, messages)}[record.dialect]
    data = record.request if isinstance(record.request, bytes) else orjson.dumps(record.request)
    request, raw = decode(data, dialect.Request, fields=dialect.RAW_FIELDS)
    body = dialect.to_upstream(request, raw)
    return {key: plain(body[key]) for key in ("messages", "tools") if body.get(key)}


def assistant_message(record: CallRecord) -> dict:
    """The call's answer as one chat assistant message: its text, reasoning and tool calls (arguments as objects,
    as vLLM hands them to a chat template) in any dialect, read as the report reads them."""
    from steps.report.exchange import response_turns  # here: the report package imports plotly

    message: dict = {"role": "assistant", "content": ""}
    for turn in response_turns(record.dialect, record.response):
        if turn["kind"] == "text":
            message["content"] += turn["text"]
        elif turn["kind"] == "reasoning":
            message["reasoning_content"] = message.get("reasoning_content", "") + turn["text"]
        elif turn["kind"] == "tool_call":
            try:
                arguments = json.loads(turn["text"])
            except ValueError:
                arguments = turn["text"]
            message.setdefault("tool_calls", []).append(
                {"type": "function", "function": {"name": turn["name"], "arguments": arguments}})
    return message


def render_call(record: CallRecord, tokenizer) -> CallRecord:
    """The call with the student's ids: its conversation rendered with a generation prompt as the prompt, and
    its answer's tokens, through the student's end-of-turn token, as the response (what the student would have
    sampled). Raises ValueError naming why it cannot be rendered."""
    if record.images:
        raise ValueError("it has images, which re-rendering does not carry")
    body = chat_body(record)
    conversation, tools = body.get("messages") or [], body.get("tools")
    prompt = list(tokenizer.apply_chat_template(conversation, tools=tools, add_generation_prompt=True,
                                                tokenize=True, return_dict=False))
    whole = list(tokenizer.apply_chat_template(conversation + [assistant_message(record)], tools=tools,
                                               tokenize=True, return_dict=False))
    if whole[:len(prompt)] != prompt:
        raise ValueError("the student's chat template renders the conversation differently once the answer is added")
    response = whole[len(prompt):]
    end = tokenizer.eos_token_id
    if end in response:  # the template's text after the end of turn (a newline) is not the model's to sample
        response = response[:len(response) - response[::-1].index(end)]
    if not response:
        raise ValueError("its answer renders to no tokens")
    return CallRecord(rollout_id=record.rollout_id, call_index=record.call_index, dialect=record.dialect,
                      status=record.status, prompt_token_ids=prompt, response_token_ids=response,
                      weight_version=record.weight_version)


def rollout_samples(result: RolloutResult, calls: list[dict], tokenizer, mode: str,
                    left_out: list[dict]) -> list[SampleRow]:
    """A kept rollout's samples: its calls (recorded, or rendered for the student), merged as the trajectories
    step merges them; a call that cannot be used is named in `left_out`."""
    records = []
    for stored in calls:
        record = CallRecord.from_json(stored)
        if record.status != "ok":
            continue
        if mode == EXACT:
            if record.prompt_token_ids is None or record.response_token_ids is None:
                left_out.append({"rollout_id": result.rollout_id, "call_index": record.call_index,
                                 "why": record.untrainable or "it has no token ids"})
                continue
            records.append(record)
            continue
        try:
            records.append(render_call(record, tokenizer))
        except (ValueError, KeyError, TypeError) as error:
            left_out.append({"rollout_id": result.rollout_id, "call_index": record.call_index, "why": str(error)})
    built = build_samples(records)
    for index, problem in built.untrainable.items():
        left_out.append({"rollout_id": result.rollout_id, "call_index": index, "why": problem})
    return [SampleRow(run="", iteration=0, rollout_id=result.rollout_id, task=result.task, sample=result.sample,
                      harness=result.harness, sample_index=index, prompt_token_ids=s.prompt_token_ids,
                      response_token_ids=s.response_token_ids, response_mask=s.response_mask,
                      response_logprobs=None, reward=result.reward, loss_weight=1.0,
                      num_calls=len(s.call_indices), call_indices=s.call_indices, weight_versions=s.weight_versions,
                      images=[]) for index, s in enumerate(built.samples)]


def student_tokenizer(student: str):
    """The student's tokenizer and chat template: from its folder, or (an `s3://` checkpoint) from its tokenizer
    files alone, fetched into a temporary folder (never its weights)."""
    import tempfile

    from transformers import AutoTokenizer

    from steps.checkpoint import fetch, is_remote

    if not is_remote(student):
        return AutoTokenizer.from_pretrained(student)
    with tempfile.TemporaryDirectory(prefix="openforge-sft-") as tmp:
        # the weights and their index are `model*` files; optimizer/ and the rest are in folders
        folder = fetch(student, Path(tmp), keep=lambda path: "/" not in path and not path.startswith("model"))
        return AutoTokenizer.from_pretrained(folder)


def build(source: str, student: str, min_reward: float) -> tuple[list[SampleRow], SftSamples]:
    """The SFT samples of the run at `source` (its URL in the store) for the `student` checkpoint."""
    same, why = same_tokenizer(recorder_of(source), student)
    report = SftSamples(source=source, mode=EXACT if same else RENDERED, why=why, min_reward=min_reward)
    results = [r for r in source_results(source) if r.status in GRADED]
    chosen = kept(results, min_reward)
    report.rollouts, report.kept_rollouts = len(results), len(chosen)
    if not chosen:
        raise SftError(f"no rollout of {source} has a reward >= {min_reward:g} ({len(results)} graded); lower "
                       f"--min-reward or record more")
    tokenizer = student_tokenizer(student)
    calls, skipped = fetch_calls_store(layout.calls_url(source), [r.rollout_id for r in chosen])
    report.left_out += [{"rollout_id": s["rollout_id"], "call_index": None, "why": s["error"]} for s in skipped]
    rows = [row for r in chosen for row in rollout_samples(r, calls[r.rollout_id], tokenizer, report.mode,
                                                           report.left_out)]
    report.samples = len(rows)
    report.trained_tokens = sum(sum(row.response_mask) for row in rows)
    return rows, report


def samples_table(rows: list[SampleRow], run: str) -> pa.Table:
    """The rows as a `samples` table (the trajectories step's schema), under the SFT run's name."""
    columns = {name: [] for name in SAMPLES.names}
    for row in rows:
        for name in SAMPLES.names:
            columns[name].append(run if name == "run" else getattr(row, name))
    return pa.table(columns, schema=SAMPLES)


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m steps.sft.samples", description=__doc__.split("\n\n")[0])
    p.add_argument("--source", required=True, help="the recorded run or eval run: <store>/<run> (folder or s3://)")
    p.add_argument("--model", required=True, help="the student checkpoint: its tokenizer and chat template")
    p.add_argument("--out", required=True, help="the partition folder the samples table is written to")
    p.add_argument("--run", default="sft", help="the SFT run's name, in the table's `run` column")
    p.add_argument("--min-reward", type=float, default=1.0, help="keep rollouts whose reward is at least this")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Build, write the table and print the report; exit code 2 with one sentence when there is nothing to train."""
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        rows, report = build(args.source.rstrip("/"), args.model, args.min_reward)
    except (SftError, CollectError) as error:
        print(f"steps.sft.samples: {error}", file=sys.stderr)
        return 2
    if not rows:
        print(f"steps.sft.samples: the {report.kept_rollouts} rollout(s) kept gave no sample "
              f"({len(report.left_out)} call(s) left out, e.g. {report.left_out[:1]})", file=sys.stderr)
        return 2
    write_table(samples_table(rows, args.run), args.out, "samples")
    with fsspec.open(f"{args.out.rstrip('/')}/_sft.json", "w") as handle:
        handle.write(json.dumps(asdict(report), indent=2) + "\n")
    print(json.dumps(asdict(report)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
