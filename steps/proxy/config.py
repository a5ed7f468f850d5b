"""The proxy's settings: one dataclass, filled from the command line (see `__main__`)."""

from dataclasses import dataclass, field

from msgspec import Raw

from steps.proxy import images
from steps.proxy.protocol import plain
from steps.sampling import RESHAPING, unsent_to_external


# What one rollout may take, as the run config's keys of these names (docs/reliability.md, "Limits"): each is a flag
# of the proxy and of the serve step (`--store-quota-mb`, ...) and a field of ProxyConfig below, whose default is
# the run's.
ROLLOUT_LIMITS = {
    "store_quota_mb": "MiB the store keeps of one rollout: its call records as written and the images its calls "
                      "stored first; at it, the rollout's further calls are refused (400)",
    "store_quota_calls": "calls the store keeps of one rollout; at it, its further calls are refused (400)",
    "image_pixel_limit": "pixels (width x height) of one image, read from its header before anything decodes it; "
                         "more is a 400",
    "request_image_mb": "MiB of images in one request; more is a 400",
}


# The judge upstream's key (`ProxyConfig.judge_api_key`): in the proxy's environment alone, the serve step's, never
# that of a step that runs rollouts (workflows/local.py) or of a rollout pod (workflows/iteration.py).
JUDGE_KEY_ENV = "OPENFORGE_JUDGE_UPSTREAM_API_KEY"


def limit_flag(key: str) -> str:
    """The flag of a key of `ROLLOUT_LIMITS`, the proxy's and the serve step's alike.

    >>> limit_flag("store_quota_mb")
    '--store-quota-mb'
    """
    return f"--{key.replace('_', '-')}"


@dataclass
class ProxyConfig:
    """Everything the proxy needs to start; flags of `python -m steps.proxy` map 1:1 onto fields."""

    upstream: str  # replica 0: the one upstream, unless `replicas` names more
    store: str
    admin_key: str
    # The run's dataset snapshots (`layout.datasets_url`), served task by task to rollout pods on the admin route
    # GET /tasks/{dataset}/{task}; empty: no tasks served.
    tasks: str = ""
    replicas: tuple[str, ...] = ()  # further vLLM servers (replicas 1, 2, ...) beside `upstream`
    replica_policy: str = "affinity"  # or "round-robin", only to measure affinity (steps/proxy/replicas.py)
    host: str = "127.0.0.1"
    port: int = 8100
    public_url: str | None = None
    # Where rollout pods' results go (PUT /rollouts/{id}/result, steps/proxy/results.py): the run's folder in the
    # store and the iteration whose rollouts (and evaluation) this proxy serves; None: it stores no results.
    run_url: str | None = None
    iteration: int | None = None
    model: str | None = None  # the model name harnesses ask for and /v1/models lists
    upstream_model: str | None = None  # the name the upstream is sent; None: `model`
    # A server the serve step did not start (a vLLM elsewhere, any OpenAI-compatible endpoint): calls it answers
    # without token ids are recorded as untrainable, and vLLM-only sampling keys at neutral are not sent to it.
    external_upstream: bool = False
    upstream_api_key: str | None = field(default=None, repr=False)  # sent upstream as a Bearer token
    # The judge a task's verifier may ask (steps/proxy/judge.py): any OpenAI-compatible endpoint, asked for
    # `judge_model`, sent `judge_api_key` as a Bearer token; None: no judge route.
    judge_upstream: str | None = None
    judge_model: str | None = None
    judge_api_key: str | None = field(default=None, repr=False)
    weight_version: str | None = None  # None: ask vLLM (/weight_info), else "0"
    adapter: str | None = None  # a LoRA adapter folder loaded at start, served as `weight_version`
    # The run's sampling (steps/sampling.py), every key, forced on every upstream call; empty: the harness's own.
    forced_sampling: dict = field(default_factory=dict)
    max_tokens_cap: int | None = None
    image_limit: int | None = None  # images per request (the run's image_limit); 0: the model takes none
    tool_images: bool = True  # the model's chat template renders images in tool turns (images.renders_tool_images)
    max_body_bytes: int = 64 * 1024 * 1024
    upstream_timeout_s: float = 1800.0
    fsync: bool = False
    log_level: str = "warning"
    http_server: str = "openforge"  # or "uvicorn": its httptools protocol instead of http_server.py
    # Limits of the proxy's own HTTP server (docs/proxy.md, "Limits"); 0 turns one off.
    max_head_bytes: int = 64 * 1024
    max_headers: int = 128
    head_timeout_s: float = 30.0
    body_timeout_s: float = 60.0
    keep_alive_s: float = 75.0
    max_connections: int | None = None  # None: half the open files the process may have (connections.py)
    max_connections_per_client: int = 1024
    # What one rollout may take (docs/proxy.md, "Limits"), the run config's keys of the same names; 0 turns one off.
    store_quota_mb: int = 128  # bytes the store keeps of one rollout: its records as written, the images it stored first
    store_quota_calls: int = 2048  # calls the store keeps of one rollout
    image_pixel_limit: int = 40_000_000  # pixels of one image (width x height), read from its header
    request_image_mb: int = 32  # bytes of the images of one request

    @property
    def upstreams(self) -> tuple[str, ...]:
        """Every replica's root URL, replica 0 first."""
        return (self.upstream, *self.replicas)

    def sampling(self, body: dict) -> dict:
        """The upstream chat body with the run's sampling forced on it, whatever the harness sent (neutral values
        too: a harness's top_p 0.5 becomes the run's 1.0) and the fields that reshape it removed (`steps.sampling.
        RESHAPING`: logit_bias, structured outputs, ...), the token cap applied, and the run's image settings
        (`images.place`: the limit per request, where a tool result's images go). An external upstream is not
        sent the vLLM-only keys at their neutral value (`steps.sampling.unsent_to_external`).

        >>> ProxyConfig("u", "s", "k", forced_sampling={"temperature": 1.0}).sampling(
        ...     {"temperature": 0.2, "logit_bias": {"7": 100}, "max_tokens": 5})
        {'temperature': 1.0, 'max_tokens': 5}
        """
        if self.forced_sampling:
            for key in RESHAPING:
                body.pop(key, None)
            body.update(self.forced_sampling)
            for key in unsent_to_external(self.forced_sampling) if self.external_upstream else ():
                del body[key]  # the harness's own value of it goes too: the run's is the neutral one
            unconstrained_tools(body)
        if self.max_tokens_cap is not None:
            asked = plain(body.get("max_tokens"))
            body["max_tokens"] = min(asked or self.max_tokens_cap, self.max_tokens_cap)
        if isinstance(body.get("messages"), list):  # a chat body kept raw holds no image (chat.to_upstream)
            body["messages"] = images.place(body["messages"], self.image_limit, self.tool_images)
        return body


def unconstrained_tools(body: dict) -> None:
    """Removes what makes vLLM constrain tool calls with a grammar, so that whether and which tool the model
    calls is its own sample: a required or named `tool_choice` becomes "auto", `parallel_tool_calls: false`
    and the tools' `strict: true` are dropped. (Under such a grammar vLLM's logprobs are those of the masked
    distribution, which the trainer does not reproduce: docs/proxy.md, "Sampling".)

    >>> body = {"tool_choice": "required", "parallel_tool_calls": False,
    ...         "tools": [{"type": "function", "function": {"name": "f", "strict": True}}]}
    >>> unconstrained_tools(body); body
    {'tool_choice': 'auto', 'tools': [{'type': 'function', 'function': {'name': 'f'}}]}
    """
    choice = plain(body.get("tool_choice"))
    if choice == "required" or isinstance(choice, dict):
        body["tool_choice"] = "auto"
    if plain(body.get("parallel_tool_calls")) is False:
        del body["parallel_tool_calls"]
    tools = body.get("tools")
    if not tools or (isinstance(tools, Raw) and b'"strict"' not in bytes(tools)):  # most calls: nothing decoded
        return
    tools = plain(tools)
    functions = [tool.get("function") for tool in tools if isinstance(tool, dict)] if isinstance(tools, list) else []
    functions = [function for function in functions if isinstance(function, dict) and function.get("strict")]
    for function in functions:  # `strict: false` constrains nothing: such tools go on as sent, not re-encoded
        del function["strict"]
    if functions:
        body["tools"] = tools
