"""One rollout's page: the exchange as the harness saw it, the training view, the verifier, the harness log.

Each is built from what the run kept (the proxy's call records, the samples table, the rollout's folder)
and says plainly what is not there (on a cluster only `result.json` is uploaded today).
"""

import json

import fsspec

from steps.report.exchange import exchange
from steps.report.html import clip, esc, number, page, table
from steps.report.images import PageImages, ReportImages
from steps.contracts.rollout import RolloutResult, harness_killed
from steps.report.data import StoredResult

MAX_FILE_BYTES = 200_000  # of a log or verifier file shown (its end, where the outcome is)
MAX_VERIFIER_FILES = 20
MAX_TURN_CHARS = 20_000  # of a turn's text shown at each end (a 10 MB tool output, a base64 image)
MAX_TOKENS = 2_000  # of a sample's response (and of its prompt) shown at each end
MAX_CHARACTER_TOKENS = 4  # a UTF-8 character is at most 4 bytes: byte tokens of one character


def shots_html(names: list[str], images: PageImages) -> str:
    """A turn's images where it sent them: thumbnails (full size on click, `assets.JS`), links past the page's
    bounds, and a line naming any the report does not show and why."""
    out = []
    for name in names:
        shot, linked = images.place(name)
        if shot is None:
            out.append(f'<p class="note">image {esc(name)} (the report was written without its image store)</p>')
        elif shot.path is None:
            out.append(f'<p class="note shot-missing">image {esc(name)} {esc(shot.problem)}</p>')
        elif linked:
            out.append(f'<p class="note"><a class="shot-link" href="../../{esc(shot.path)}">image {esc(name[:12])}, '
                       f'{shot.width}x{shot.height}, {shot.size / 1e3:,.0f} KB</a> (linked, not shown: {esc(linked)})</p>')
        else:
            out.append(f'<a class="shot" href="../../{esc(shot.path)}"><img src="../../{esc(shot.path)}" loading="lazy" '
                       f'width="{shot.width}" height="{shot.height}" alt="image {esc(name[:12])}, {shot.width}x{shot.height}" '
                       f'title="{shot.width}x{shot.height}, {shot.size / 1e3:,.0f} KB: click for full size"></a>')
    return f'<div class="shots">{"".join(out)}</div>' if out else ""


def _turns(turns: list[dict], images: PageImages) -> str:
    out = []
    for t in turns:
        kind = "tool-call" if t["kind"] == "tool_call" else t["kind"].replace("_", "-")
        name = f" · {esc(t['name'])}" if t.get("name") else ""
        if t.get("changed"):  # sent back by the harness, but not what the model answered
            name += " · differs from the model&#x27;s response to the call before"
        text = "" if t.get("images") and not t["text"] else f'<pre>{esc(clip(str(t["text"]), MAX_TURN_CHARS))}</pre>'
        out.append(f'<div class="turn role-{esc(t["role"])} {esc(kind)}"><span class="kind">{esc(t["role"])} · '
                   f'{esc(t["kind"].replace("_", " "))}{name}</span>{text}{shots_html(t.get("images") or [], images)}</div>')
    return "".join(out)


def tools_html(tools) -> str:
    """The tool definitions a request offered, folded: their names, and the definitions as sent.

    >>> "shell" in tools_html([{"type": "function", "function": {"name": "shell"}}])
    True
    """
    def name(tool) -> str:
        if not isinstance(tool, dict):
            return "?"
        inner = tool.get("function") if isinstance(tool.get("function"), dict) else tool
        return str(inner.get("name", tool.get("type", "?")))
    listed = tools if isinstance(tools, list) else [tools]
    return (f'<details class="tools"><summary>tools offered ({len(listed)}): {esc(", ".join(map(name, listed)))}'
            f'</summary><pre>{esc(clip(json.dumps(tools, ensure_ascii=False, indent=1), MAX_TURN_CHARS))}</pre></details>')


def exchange_html(records: list[dict] | None, calls: dict[int, dict], images: PageImages | None = None) -> str:
    """Every call: what its request added (its screenshots among it), its response, and how the trajectories step
    used it."""
    images = images or PageImages(None)
    if records is None:
        return '<p class="note">The proxy\'s store holds no calls of this rollout (or the run has no calls store).</p>'
    out, offered = [], None
    for call, record in zip(exchange(records), records):
        tools = (record.get("request") or {}).get("tools") if isinstance(record.get("request"), dict) else None
        shown_tools = tools_html(tools) if tools and tools != offered else ""  # once, and again when they change
        offered = tools or offered
        row = calls.get(record.get("call_index"), {})
        sample = row.get("sample_index")
        used = "not trained on" if sample is None else f"sample {sample}, " + (
            "extended it token-exactly" if row.get("continued") else "started it")
        meta = (f"call {esc(record.get('call_index'))} · {esc(record.get('dialect'))} · {esc(record.get('status'))} · "
                f"finish {esc(record.get('finish_reason'))} · weights {esc(record.get('weight_version'))} · {esc(used)}")
        rewritten = "" if call["rewritten_from"] is None else \
            f'<p class="split">The harness rewrote its history from turn {call["rewritten_from"]}: shown from there.</p>'
        error = "".join(f"<pre>{esc(clip(str(record[key]), MAX_TURN_CHARS))}</pre>" for key in ("error", "store_error")
                        if record.get(key))
        out.append(f'<div class="call" id="call-{esc(record.get("call_index"))}"><h3>{meta}</h3>{rewritten}{error}{shown_tools}'
                   f'{_turns(call["added"], images)}<div class="response">{_turns(call["response"], images)}</div></div>')
    return "".join(out)


class Decoder:
    """Token ids as text with a checkpoint's tokenizer (`tokenizers`), else as the ids themselves."""

    def __init__(self, tokenizer=None):
        self.tokenizer, self.pieces = tokenizer, {}

    def piece(self, token_id: int) -> str:
        """One token as text (cached per id)."""
        if self.tokenizer is None:
            return f"{token_id} "
        if token_id not in self.pieces:
            try:
                self.pieces[token_id] = self.tokenizer.decode([token_id], skip_special_tokens=False)
            except Exception:  # an id outside the vocabulary (another tokenizer's): shown as the id
                self.pieces[token_id] = f"[{token_id}]"
        return self.pieces[token_id]

    def decode(self, ids: list[int]) -> str:
        """A run of tokens decoded together (a character spread over tokens comes out whole)."""
        if self.tokenizer is None:
            return "".join(self.piece(i) for i in ids)
        try:
            return self.tokenizer.decode(list(ids), skip_special_tokens=False)
        except Exception:  # an id outside the vocabulary: token by token, it shown as the id
            return "".join(self.piece(i) for i in ids)

    def text(self, ids: list[int]) -> str:
        """A run of tokens as text."""
        return self.decode(ids)

    def pieces_of(self, ids: list[int]) -> list[str]:
        """Each token's text, where a character split over tokens (UTF-8 bytes, U+FFFD alone) is given whole
        to its last token and the ones before show nothing: one piece per token, no broken characters."""
        out, pending = [], []
        for token_id in ids:
            pending.append(token_id)
            text = self.decode(pending) if len(pending) > 1 else self.piece(token_id)
            if text.endswith("\ufffd") and len(pending) < MAX_CHARACTER_TOKENS:
                out.append("")
                continue
            out.append(text)
            pending = []
        return out


def split_reason(call_index: int, sample_index: int, records: dict[int, dict], calls: dict[int, dict],
                 decoder: Decoder) -> str:
    """Why call `call_index` started sample `sample_index` instead of extending an earlier one: where its
    prompt first differs from the closest earlier sample as that sample stood then."""
    if sample_index == 0:
        return "the rollout's first trained call"
    prompt = (records.get(call_index) or {}).get("prompt_token_ids") or []
    best = None  # (shared tokens, earlier sample, its tokens then)
    for earlier in range(sample_index):
        members = [i for i, c in calls.items() if c.get("sample_index") == earlier and i < call_index and i in records]
        if not members:
            continue
        last = records[max(members)]
        tokens = (last.get("prompt_token_ids") or []) + (last.get("response_token_ids") or [])
        shared = next((n for n, (a, b) in enumerate(zip(prompt, tokens)) if a != b), min(len(prompt), len(tokens)))
        if best is None or shared > best[0]:
            best = (shared, earlier, tokens)
    if best is None:
        return "no earlier sample's calls are readable to compare with"
    shared, earlier, tokens = best
    if shared == len(tokens):
        return f"its prompt extends sample {earlier} (a check that failed only on a call the page cannot read)"
    if shared == len(prompt):
        return (f"its prompt ({len(prompt)} tokens) is a prefix of sample {earlier} ({len(tokens)} tokens): "
                "the harness dropped context")
    return (f"its prompt first differs from sample {earlier} at token {shared} of {len(tokens)}: the sample has "
            f"{decoder.text(tokens[shared:shared + 8])!r}, the prompt {decoder.text(prompt[shared:shared + 8])!r} "
            f"(after {decoder.text(tokens[max(0, shared - 8):shared])!r})")


def _ends(n: int) -> tuple[range, int, range]:
    """Which of n tokens are shown: the first and last `MAX_TOKENS`, and how many in between are not."""
    if n <= 2 * MAX_TOKENS:
        return range(n), 0, range(0)
    return range(MAX_TOKENS), n - 2 * MAX_TOKENS, range(n - MAX_TOKENS, n)


def _tokens(sample: dict, decoder: Decoder) -> str:
    ids, mask = sample.get("response_token_ids") or [], sample.get("response_mask") or []
    logprobs = sample.get("response_logprobs") or [None] * len(ids)

    def spans(positions: range) -> str:
        pieces = decoder.pieces_of([ids[i] for i in positions])
        return "".join(f'<span class="m{int(mask[i])}" title="id {ids[i]} · mask {int(mask[i])}'
                       f'{"" if logprobs[i] is None or not mask[i] else f" · logprob {logprobs[i]:.3f}"}">'
                       f'{esc(piece)}</span>' for i, piece in zip(positions, pieces))
    head, left_out, tail = _ends(min(len(ids), len(mask), len(logprobs)))
    gap = f'<span class="note">[{left_out} tokens left out]</span>' if left_out else ""
    prompt = sample.get("prompt_token_ids") or []
    first, skipped, last = _ends(len(prompt))
    shown = decoder.text([prompt[i] for i in first]) + (f"\n[{skipped} tokens left out]\n" if skipped else "") + \
        decoder.text([prompt[i] for i in last])
    return (f'<details><summary>prompt: {len(prompt)} tokens (not trained on)</summary>'
            f'<div class="tokens pr">{esc(shown)}</div></details><div class="tokens">{spans(head)}{gap}{spans(tail)}</div>')


def training_html(samples: list[dict], records: dict[int, dict], calls: dict[int, dict], decoder: Decoder) -> str:
    """Each sample: its calls, its tokens (mask 1 blue: trained on; mask 0 grey: tool output and template
    tokens), logprobs on hover, and where and why it split from the samples before it."""
    if not samples:
        return '<p class="note">No training samples (the rollout is not trained on, or its tables are not written).</p>'
    how = "Tokens decoded with the checkpoint's tokenizer" if decoder.tokenizer else \
        "No tokenizer found for the checkpoint: token ids shown"
    out = [f'<p class="note">{esc(how)}; blue: mask 1 (trained on), grey: mask 0; hover a token for its id and '
           "sampled logprob.</p>"]
    for sample in samples:
        trained = sum(int(m) for m in sample.get("response_mask") or [])
        first = (sample.get("call_indices") or [None])[0]
        why = split_reason(first, sample["sample_index"], records, calls, decoder) if first is not None else ""
        out.append(f'<section class="sample" data-sample-index="{sample["sample_index"]}" data-trained-tokens="{trained}">'
                   f'<h3>sample {sample["sample_index"]}: calls {esc(sample.get("call_indices"))} · {trained} trained tokens · '
                   f'reward {number(sample.get("reward"))} · loss weight {number(sample.get("loss_weight"))}</h3>'
                   f'<p class="split">starts here: {esc(why)}</p>{_tokens(sample, decoder)}</section>')
    return "".join(out)


def _read_tail(fs, path: str) -> str:
    size = fs.size(path)
    with fs.open(path, "rb") as f:
        if size > MAX_FILE_BYTES:
            f.seek(size - MAX_FILE_BYTES)
        data = f.read(MAX_FILE_BYTES)
    cut = f"[the first {size - MAX_FILE_BYTES} bytes left out]\n" if size > MAX_FILE_BYTES else ""
    return cut + data.decode("utf-8", errors="replace")


def kept_files(paths: dict, where: str | None, key: str) -> list[tuple[str, str]]:
    """(name, text) of what `result.json`'s `paths[key]` names, read only from the rollout's own folder (the
    one holding result.json, at `where`: a path elsewhere is not followed) and never through a link; [] if absent."""
    named = paths.get(key)
    if not named or not where:
        return []
    base = str(named).replace("\\", "/").rstrip("/").rsplit("/", 1)[-1]
    if base in ("", ".", ".."):
        return []
    fs, folder = fsspec.core.url_to_fs(where.rsplit("/", 1)[0])
    path = f"{folder}/{base}"
    try:
        info = fs.info(path)
        if info.get("islink"):
            return []
        if info["type"] == "file":
            return [(base, _read_tail(fs, path))]
        entries = sorted((e for e in fs.ls(path, detail=True) if e["type"] == "file" and not e.get("islink")),
                         key=lambda e: e["name"])
        shown = [(e["name"].rsplit("/", 1)[-1], _read_tail(fs, e["name"])) for e in entries[:MAX_VERIFIER_FILES]]
        more = len(entries) - MAX_VERIFIER_FILES
        names = ", ".join(e["name"].rsplit("/", 1)[-1] for e in entries[MAX_VERIFIER_FILES:])
        return shown + ([(f"[{more} more files not shown]", clip(names, MAX_TURN_CHARS))] if more > 0 else [])
    except (FileNotFoundError, OSError):
        return []


def files_html(files: list[tuple[str, str]], what: str) -> str:
    """Files shown as text, or one line saying they are not there."""
    if not files:
        return (f'<p class="note">No {what} in the rollout\'s folder (on a cluster only result.json is uploaded; '
                "a rollout that never started has none).</p>")
    return "".join(f"<h3>{esc(name)}</h3><pre>{esc(text)}</pre>" for name, text in files)


def judge_html(records: list[dict] | None) -> str:
    """The calls the verifier made to the run's judge (`[verifier] judge = true`): what it asked and what the judge
    answered, as the exchange shows a call; nothing for a rollout without a judge.

    >>> judge_html(None), judge_html([])
    ('', '')
    """
    if not records:
        return ""
    return (f'<div class="judge"><h3 id="judge">Judge calls ({len(records)}): asked by the verifier, never trained '
            f'on</h3>{exchange_html(records, {})}</div>')


def rollout_page(row: dict, stored: StoredResult | None, records: list[dict] | None, calls: list[dict],
                 samples: list[dict], decoder: Decoder, kind: str, images: ReportImages | None = None,
                 judge_records: list[dict] | None = None) -> str:
    """The whole page of one rollout; `images` copies the screenshots it shows into the site; `judge_records`: its
    verifier's calls to the judge."""
    result = stored.result if stored else RolloutResult(str(row.get("rollout_id")), "", "", "", None)
    where = stored.url if stored else None
    by_index = {c["call_index"]: c for c in calls}
    records_by_index = {r.get("call_index"): r for r in records or []}
    facts = [["rollout", row.get("rollout_id")], ["kind", kind], ["iteration", row.get("iteration")],
             ["task", row.get("task")], ["sample", row.get("sample")], ["harness", row.get("harness")],
             ["status", row.get("status")],
             ["harness killed by", row.get("harness_killed") or harness_killed(result)],
             ["killed by a limit", result.killed or None],
             ["reward", row.get("reward")], ["rewards", row.get("rewards") or result.rewards or None],
             ["error", row.get("error")], ["calls", row.get("num_calls")], ["response tokens", row.get("response_tokens")],
             ["duration (s)", row.get("total_s")],
             ["weight versions", row.get("weight_versions") or result.weight_versions or None],
             ["notes", result.notes if stored else None]]
    body = (f'<p><a href="../../index.html">&larr; run report</a></p><h1>Rollout {esc(row.get("rollout_id"))}</h1>'
            f'{table(["field", "value"], [[k, json.dumps(v) if isinstance(v, (list, dict)) else v] for k, v in facts])}'
            f'<h2 id="exchange">Exchange</h2>{exchange_html(records, by_index, PageImages(images))}'
            f'<h2 id="training">Training view</h2>{training_html(samples, records_by_index, by_index, decoder)}'
            f'<h2 id="verifier">Verifier</h2><p>reward {number(row.get("reward"))}</p>{judge_html(judge_records)}'
            f'{files_html(kept_files(result.paths, where, "verifier_output"), "verifier output")}'
            f'<h2 id="log">Harness log</h2>{files_html(kept_files(result.paths, where, "harness_log"), "harness log")}')
    return page(f"{row.get('rollout_id')}: rollout", body, "../../assets", ["report.js"])
