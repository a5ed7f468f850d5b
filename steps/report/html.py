"""HTML pieces of the report, safe for text the agent or the harness controls.

Everything shown goes through `esc`; JSON put into a page goes through `json_script`, which cannot close
its `<script>` tag; a rollout id or task name becomes a file name only through `file_name`, which cannot
leave its folder; plot labels go through `label` (plotly reads a few HTML tags in labels, links among them).
"""

import hashlib
import html
import json
import math
import re

from steps.report.assets import CSS


def esc(value) -> str:
    """`value` as HTML text (quotes too, so it is safe in an attribute).

    >>> esc('</script><img src=x onerror="alert(1)">')
    '&lt;/script&gt;&lt;img src=x onerror=&quot;alert(1)&quot;&gt;'
    """
    return html.escape("" if value is None else str(value), quote=True)


def label(value) -> str:
    """A string for a plotly label or hover text: its tags shown, never read (plotly renders <a href>, <b>).

    >>> label("<a href='javascript:x'>t</a>")
    '&lt;a href=&#x27;javascript:x&#x27;&gt;t&lt;/a&gt;'
    """
    return esc(value)


def finite(data):
    """`data` with every NaN or infinity as None (JSON has neither: a page's script would not parse it).

    >>> finite({"a": [float("nan"), 1.0, float("inf")], "b": (2,)})
    {'a': [None, 1.0, None], 'b': [2]}
    """
    if isinstance(data, float):
        return data if math.isfinite(data) else None
    if isinstance(data, dict):
        return {k: finite(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [finite(v) for v in data]
    return data


def json_text(data) -> str:
    """JSON that cannot end the `<script>` element holding it, nor open a comment or CDATA in it.

    >>> json_text({"out": "</script><script>alert(1)</script>"})
    '{"out": "\\\\u003c/script\\\\u003e\\\\u003cscript\\\\u003ealert(1)\\\\u003c/script\\\\u003e"}'
    """
    text = json.dumps(finite(data), ensure_ascii=False, allow_nan=False, default=str)
    for raw, escaped in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"), ("\u2028", "\\u2028"), ("\u2029", "\\u2029")):
        text = text.replace(raw, escaped)
    return text


def clip(text: str, keep: int) -> str:
    """`text` whole up to 2 x `keep` characters; past that its first and last `keep` with the middle left out
    and counted (a tool output, a log: its start and its outcome), so that no text makes a page unbounded.

    >>> print(clip("abcdefghij", 2))
    ab
    [6 characters left out]
    ij
    >>> clip("abcd", 2)
    'abcd'
    """
    if len(text) <= 2 * keep:
        return text
    return f"{text[:keep]}\n[{len(text) - 2 * keep} characters left out]\n{text[-keep:]}"


def json_script(element_id: str, data) -> str:
    """A `<script type="application/json">` element that a page's script reads with `JSON.parse`."""
    return f'<script type="application/json" id="{esc(element_id)}">{json_text(data)}</script>'


def file_name(name: str) -> str:
    """A file name for `name` (a rollout id, a task name) that stays in its folder and is unique per name:
    only letters, digits, `_` and `-`, cut to 60 characters, and a digest of the whole name.

    >>> file_name("../../etc/passwd")
    '______etc_passwd-3754d6cb'
    >>> file_name("it0-hello-s1") != file_name("it0-hello_s1")
    True
    """
    digest = hashlib.sha256(name.encode()).hexdigest()[:8]
    return f"{re.sub(r'[^A-Za-z0-9_-]', '_', name)[:60]}-{digest}"


def number(value, digits: int = 3) -> str:
    """A number for a table cell: rounded, blank when missing.

    >>> number(0.123456), number(None), number(7), number(True)
    ('0.123', '', '7', 'True')
    """
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.{digits}f}" if value == value else "nan"
    return esc(value)


def table(headers: list[str], rows: list[list], cls: str = "") -> str:
    """An HTML table; every cell escaped (numbers rounded)."""
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{number(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f'<table class="{esc(cls)}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def page(title: str, body: str, assets: str, scripts: list[str] = ()) -> str:
    """A whole page: `assets` is the relative path to the site's assets folder (`assets` or `../../assets`).
    Nothing is loaded from the network; the content security policy says so to the browser too."""
    tags = "".join(f'<script src="{esc(assets)}/{esc(s)}"></script>' for s in scripts)
    return (f'<!doctype html><html><head><meta charset="utf-8"><title>{esc(title)}</title>'
            "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; script-src 'self'; "
            "style-src 'self' 'unsafe-inline'; img-src 'self' data:; base-uri 'none'; form-action 'none'\">"
            f"<style>{CSS}</style></head><body>{body}{tags}</body></html>")
