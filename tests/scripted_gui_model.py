"""A scripted stand-in for vLLM's chat server that works a browser for browser-use, by the page's element list.

    with ScriptedGuiModel([[{"input": {"element": {"id": "email"}, "text": "a@b.c"}},
                            {"click": {"element": {"text": "Submit"}}}]]) as server:
        ...  # point the proxy at server.url

Why a double: a GUI task needs a model that reads the page and acts on it (fill a field, press a button,
say it is done) in the exact JSON shape the harness demands; no model that runs here can, let alone solve
a task. This server replays a task's oracle actions instead, answering in the shape the proxy reads from
vLLM (`scripted_model.completion`: `prompt_token_ids`, `choices[0].token_ids`, per-token logprobs).

browser-use asks for a strict `response_format` json_schema ("agent_output") and sends, each call, the
step number (`<step_info>StepN`) and the page's interactive elements as `[INDEX]<tag ...>` lines, each
followed by its text. Step N plays script step N: one action, or a list of them in one reply (as a model
fills a whole form in one step; browser-use skips the rest of a list once the page changes). An action's
`element` describes one the way the oracle's Playwright selector does (`{"id": "email"}` for `#email`,
`{"text": "Create account"}` for `text=Create account`, `"after"` for the row it sits in) and is resolved
to that element's index in the list, as a model reading the list would (`element_index`). The reply is
completed to the request's schema (every required field present), so it passes the same strict check a
real model's constrained decoding would. Past the last step it answers `done`.
"""

from __future__ import annotations

import json
import re
import threading
import time

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from scripted_model import Reply, completion, error

from steps.net import HOST, free_port

STEP = re.compile(r"<step_info>\s*Step\s*(\d+)")
TAG = re.compile(r"\[(\d+)\]<([^\n]*)")
ATTRIBUTE = re.compile(r"([\w-]+)=((?:(?! [\w-]+=| ?/>).)*)")
ELEMENTS = "Interactive elements:"
STATE_END = "</browser_state>"
LINE = re.compile(r"[^\n]+")


def user_text(body: dict) -> str:
    """The text parts of the request's messages, one after another."""
    texts = []
    for message in body.get("messages", []):
        content = message.get("content")
        parts = [content] if isinstance(content, str) else [p.get("text") for p in content or [] if isinstance(p, dict)]
        texts += [part for part in parts if isinstance(part, str)]
    return "\n".join(texts)


def listed_elements(text: str) -> list[tuple[int, dict[str, str], str, int]]:
    """The page's element list in the request's last `Interactive elements:` block: for each `[INDEX]<tag ...>`
    line, (index, its attributes, the text lines under it up to the next element, where its line starts).

    >>> listed_elements("Interactive elements:\\n[3]<input name=q placeholder=Search />\\n*[4]<button />\\n\\tGo")
    [(3, {'name': 'q', 'placeholder': 'Search'}, '', 22), (4, {}, 'Go', 61)]
    """
    start = text.rfind(ELEMENTS)
    if start < 0:
        return []
    end = text.find(STATE_END, start)
    found: list[list] = []
    for line in LINE.finditer(text, start + len(ELEMENTS), end if end >= 0 else len(text)):
        tag = TAG.search(line.group(0))
        if tag:
            found.append([int(tag.group(1)), dict(ATTRIBUTE.findall(tag.group(2))), "", line.start()])
        elif found and line.group(0).strip():
            found[-1][2] = f"{found[-1][2]}\n{line.group(0).strip()}".strip()
    return [tuple(element) for element in found]


def element_index(text: str, wanted: dict[str, str]) -> int | None:
    """The index of the first listed element that `wanted` describes, as a model reading the list would pick
    it: `text` is found in the element's text, every other key is one of its tag's attributes with that value,
    and `after` (optional) is text the element's line comes after (the row of a list it belongs to).

    >>> page = ("Interactive elements:\\n[3]<input id=q placeholder=Search />\\n[4]<button />\\n\\tSearch\\n"
    ...         "Dune\\n[5]<button />\\n\\tBorrow\\nKindred\\n[6]<button />\\n\\tBorrow\\n")
    >>> element_index(page, {"id": "q"}), element_index(page, {"text": "Search"})
    (3, 4)
    >>> element_index(page, {"text": "Borrow", "after": "Kindred"}), element_index(page, {"text": "Nope"})
    (6, None)
    """
    wanted = dict(wanted)
    after = text.find(wanted.pop("after"), text.rfind(ELEMENTS)) if "after" in wanted else 0
    words = wanted.pop("text", None)
    if after < 0:
        return None
    for index, attributes, label, position in listed_elements(text):
        if (position >= after and (words is None or words in label)
                and all(attributes.get(key) == value for key, value in wanted.items())):
            return index
    return None


def resolve(schema: dict, defs: dict) -> dict:
    """`schema` with a `$ref` followed."""
    while isinstance(schema, dict) and "$ref" in schema:
        schema = defs[schema["$ref"].rsplit("/", 1)[-1]]
    return schema


def conform(value, schema: dict, defs: dict):
    """`value` completed to `schema`: every required property of an object filled (with a blank of its type).

    >>> conform({}, {"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "boolean"}},
    ...              "required": ["a", "b"]}, {})
    {'a': '', 'b': False}
    """
    schema = resolve(schema, defs)
    if "anyOf" in schema:
        branches = [resolve(b, defs) for b in schema["anyOf"]]
        if value is None and any(b.get("type") == "null" for b in branches):
            return None
        fits = [b for b in branches if isinstance(value, dict) and set(value) <= set(b.get("properties", {}))
                and b.get("type") == "object"]
        return conform(value, (fits or [b for b in branches if b.get("type") != "null"] or branches)[0], defs)
    kind = schema.get("type")
    if kind == "object":
        value = dict(value or {})
        properties = schema.get("properties", {})
        for name in schema.get("required", list(properties)):
            value[name] = conform(value.get(name), properties.get(name, {}), defs)
        return value
    if kind == "array":
        return [conform(item, schema.get("items", {}), defs) for item in value or []]
    if value is not None:
        return value
    if "default" in schema:
        return schema["default"]
    return {"string": "", "boolean": False, "integer": 0, "number": 0}.get(kind)


def resolved(action: dict, text: str) -> dict | None:
    """`action` with its `element` resolved to that element's index on the page, or None if none fits."""
    (name, params), = action.items()
    params = dict(params)
    if "element" in params:
        index = element_index(text, params.pop("element"))
        if index is None:
            return None
        params["index"] = index
    return {name: params}


def actions_for(step: int, steps: list, text: str) -> list[dict]:
    """The actions step `step` (1-based) plays (a script step is one action or a list of them, played in one
    reply), each `element` resolved to an index; `done` past the end, or when an element is not on the page."""
    if step > len(steps):
        return [{"done": {"text": "done", "success": True}}]
    wanted = steps[step - 1] if isinstance(steps[step - 1], list) else [steps[step - 1]]
    actions = [resolved(action, text) for action in wanted]
    if None in actions:
        missing = wanted[actions.index(None)]
        return [{"done": {"text": f"no element fits {missing} on this page", "success": False}}]
    return actions


def agent_output(body: dict, steps: list) -> str:
    """The reply's JSON: the step's actions, completed to the request's strict agent_output schema."""
    text = user_text(body)
    found = STEP.search(text)
    actions = actions_for(int(found.group(1)) if found else 1, steps, text)
    schema = ((body.get("response_format") or {}).get("json_schema") or {}).get("schema") or {}
    output = {"thinking": "Following the oracle.", "evaluation_previous_goal": "", "memory": "",
              "next_goal": "Run " + ", ".join(next(iter(action)) for action in actions), "action": actions}
    return json.dumps(conform(output, schema, schema.get("$defs", {})) if schema else output)


def create_app(steps: list, model: str = "tiny") -> FastAPI:
    """The scripted GUI server playing `steps` (each an action or a list of them); its request log is
    `app.state.exchanges`."""
    app = FastAPI(title="scripted GUI model")
    app.state.steps = list(steps)
    app.state.exchanges = []

    @app.get("/health")
    async def health() -> dict:
        return {}

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [{"id": model, "object": "model", "created": 0, "owned_by": "openforge",
                                            "max_model_len": 262144}]}

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> JSONResponse:
        body = await request.json()
        if body.get("stream"):
            return error(400, "the scripted GUI model answers non-streaming requests only")
        if body.get("model") != model:
            return error(404, f"The model `{body.get('model')}` does not exist.")
        response = completion(body, Reply(content=agent_output(body, app.state.steps)), model)
        app.state.exchanges.append({"request": body, "response": response})
        return JSONResponse(response)

    return app


class ScriptedGuiModel:
    """The scripted GUI server on a free loopback port, in a background thread."""

    def __init__(self, steps: list, model: str = "tiny"):
        self.app = create_app(steps, model)
        self.port = free_port()
        self.url = f"http://{HOST}:{self.port}"
        self._server = uvicorn.Server(uvicorn.Config(self.app, host=HOST, port=self.port, log_level="warning"))
        self._thread = threading.Thread(target=self._server.run, daemon=True)

    @property
    def exchanges(self) -> list[dict]:
        """Every chat completion served so far: `{"request": ..., "response": ...}`."""
        return self.app.state.exchanges

    def __enter__(self) -> ScriptedGuiModel:
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError(f"the scripted GUI model did not start on {self.url}")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)
