"""The run's sampling settings: how vLLM samples every rollout token, and which of them the trainer reproduces.

    >>> settings = {**NEUTRAL, "temperature": 0.7}
    >>> unmatched(settings), as_flags(settings)[:2]
    ({}, ['--sampling', 'temperature=0.7'])
    >>> unmatched({**settings, "top_p": 0.9})
    {'top_p': 0.9}

The run config owns them (`workflows/config.py`); the serve step passes them to the proxy as `--sampling
KEY=VALUE`, and the proxy forces every key on every upstream call, whatever the harness sent (neutral values
included, so a harness's top_p 0.5 becomes the run's 1.0). The update computes its logprobs as
log_softmax(logits / temperature): the other keys reshape the distribution in ways it does not reproduce,
so they must keep their neutral values unless the run accepts unmatched logprobs. top_k 0 means off.
"""

from collections.abc import Callable

# The settings the trainer reproduces exactly: each key's neutral value (vLLM's own default).
NEUTRAL = {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0, "presence_penalty": 0.0,
           "frequency_penalty": 0.0, "repetition_penalty": 1.0}
KEYS = tuple(NEUTRAL)
# The keys OpenAI's chat API does not have (vLLM's extensions): an external upstream, which may be any
# OpenAI-compatible endpoint and refuse them, is not sent those at their neutral value (docs/serving.md).
VLLM_ONLY = ("top_k", "min_p", "repetition_penalty")
# Request fields of vLLM's chat API that also reshape the distribution tokens are drawn from (or how they are
# drawn): with the run's sampling forced, the proxy removes them from every upstream call, so a harness cannot
# bias, mask or constrain what the trainer takes for the policy's own distribution. The record keeps what the
# harness asked for (`sampling_requested`). Tool-call grammars are lifted as well (`steps.proxy.config.
# unconstrained_tools`): a required or named tool_choice, parallel_tool_calls false, strict tools.
RESHAPING = ("logit_bias", "allowed_token_ids", "bad_words", "min_tokens", "ignore_eos", "logits_processors",
             "response_format", "structured_outputs", "guided_json", "guided_regex", "guided_choice",
             "guided_grammar", "guided_decoding_backend", "guided_whitespace_pattern", "use_beam_search", "best_of",
             "length_penalty", "typical_p", "vllm_xargs", "thinking_token_budget")
# Each key's accepted values: (test, what a message says is accepted).
RANGES: dict[str, tuple[Callable[[float], bool], str]] = {
    "temperature": (lambda v: 0 < v <= 2, "a number in (0, 2] (0 would be greedy: no distribution to train on)"),
    "top_p": (lambda v: 0 < v <= 1, "a number in (0, 1]"),
    "top_k": (lambda v: v >= 0 and v == int(v), "0 (off) or a whole number >= 1"),
    "min_p": (lambda v: 0 <= v <= 1, "a number in [0, 1]"),
    "presence_penalty": (lambda v: -2 <= v <= 2, "a number in [-2, 2]"),
    "frequency_penalty": (lambda v: -2 <= v <= 2, "a number in [-2, 2]"),
    "repetition_penalty": (lambda v: 0 < v <= 2, "a number in (0, 2]"),
}


def settings(config) -> dict:
    """The sampling settings of a run config (any object with the `KEYS` as attributes), in `KEYS` order."""
    return {key: getattr(config, key) for key in KEYS}


def problem(key: str, value: float) -> str | None:
    """Why `value` is no setting for `key` (one phrase naming what is accepted), or None when it is one.

    >>> problem("top_k", -1)
    'must be 0 (off) or a whole number >= 1, got -1'
    """
    test, accepted = RANGES[key]
    return None if test(value) else f"must be {accepted}, got {value!r}"


def unmatched(settings: dict) -> dict:
    """The settings that are not neutral apart from temperature: the ones the trainer cannot reproduce."""
    return {key: settings[key] for key in KEYS if key != "temperature" and settings[key] != NEUTRAL[key]}


def unsent_to_external(settings: dict) -> list[str]:
    """The keys of `settings` an external upstream is not sent: the vLLM-only ones at their neutral value (an
    endpoint that does not know a key samples as if it were neutral, and a strict one refuses it).

    >>> unsent_to_external({**NEUTRAL, "top_k": 20})
    ['min_p', 'repetition_penalty']
    """
    return [key for key in VLLM_ONLY if key in settings and settings[key] == NEUTRAL[key]]


def describe(settings: dict) -> str:
    """`{"top_p": 0.9, "top_k": 20}` as "top_p=0.9,top_k=20" (one command-line word, for metrics and summaries)."""
    return ",".join(f"{key}={value}" for key, value in settings.items())


def as_flags(settings: dict) -> list[str]:
    """Every key as the serve step's and the proxy's `--sampling KEY=VALUE` flags."""
    return [word for key in KEYS for word in ("--sampling", f"{key}={settings[key]}")]
