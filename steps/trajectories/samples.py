"""Turning a rollout's recorded calls into training samples, token-exactly, without re-tokenising.

A call continues a sample when its prompt starts with that sample's tokens so far (the earlier calls'
prompts and responses, exactly as vLLM saw and sampled them); what the prompt adds after that prefix
(tool output, user turns, template tokens between turns) joins the sample with mask 0, and the call's
response with mask 1 and its logprobs. A call that continues no open sample (history rewritten,
compaction, a harness that moves messages) starts a new one. Every open sample of the rollout is a
candidate, not only the last one, so a side call (a title, a subagent) in between does not split the
main conversation; the longest matching sample wins.

Token ids alone do not say which screenshot a prompt held: two different images of one size expand to
the same image-token ids. A call continues a sample only if its images (their SHA-256 names, in prompt
order) also start with the sample's images; the images it adds join the sample's. A call whose image
tokens do not match its images' grids (steps.trajectories.vision), or whose images cannot be read back, is
trained on not at all: `untrainable` names it with why.
"""

from dataclasses import dataclass, field

from steps.contracts.calls import CallRecord
from steps.trajectories.vision import ImageGrid


@dataclass
class Sample:
    """One training sequence: the first call's prompt, then everything after it with a mask."""

    prompt_token_ids: list[int]
    response_token_ids: list[int] = field(default_factory=list)
    response_mask: list[int] = field(default_factory=list)
    response_logprobs: list[float] | None = field(default_factory=list)  # None: a merged call had none
    call_indices: list[int] = field(default_factory=list)
    weight_versions: list[str] = field(default_factory=list)
    images: list[str] = field(default_factory=list)  # SHA-256 names, in prompt order

    def __len__(self) -> int:
        return len(self.prompt_token_ids) + len(self.response_token_ids)

    def continued_by(self, prompt: list[int], images: list[str] = ()) -> bool:
        """Whether `prompt` starts with this sample's tokens, token for token, and `images` with its images."""
        n_prompt = len(self.prompt_token_ids)
        return (len(prompt) >= len(self) and list(images[:len(self.images)]) == self.images
                and prompt[:n_prompt] == self.prompt_token_ids
                and prompt[n_prompt:len(self)] == self.response_token_ids)

    def append(self, call: CallRecord, added: list[int], images: list[str] = ()) -> None:
        """Adds `added` (prompt tokens the call brought, mask 0), the call's response (mask 1), and the
        images its prompt adds to the sample's."""
        self.images += images[len(self.images):]
        response = call.response_token_ids
        logprobs = call.response_logprobs
        self.response_token_ids += added + response
        self.response_mask += [0] * len(added) + [1] * len(response)
        if self.response_logprobs is not None and logprobs is not None and len(logprobs) == len(response):
            self.response_logprobs += [0.0] * len(added) + [float(x) for x in logprobs]
        else:
            self.response_logprobs = None
        self.call_indices.append(call.call_index)
        version = call.weight_version
        if version is not None and str(version) not in self.weight_versions:
            self.weight_versions.append(str(version))


@dataclass
class RolloutSamples:
    """A rollout's samples and how its calls went into them."""

    samples: list[Sample]
    sample_of_call: dict[int, int]  # call_index -> index into `samples`
    continued_calls: set[int]  # call indices that extended an existing sample
    used_calls: int  # ok calls with token ids, the ones merged into samples
    untrainable: dict[int, str] = field(default_factory=dict)  # call_index -> why it is in no sample

    @property
    def continuable_calls(self) -> int:
        """Calls after the first used one: those that could have continued a sample."""
        return max(self.used_calls - 1, 0)


def usable(call: CallRecord) -> bool:
    """An `ok` call with token ids; aborted and failed calls, and calls without tokens, are skipped."""
    return call.status == "ok" and call.prompt_token_ids is not None and call.response_token_ids is not None


def image_names(call: CallRecord) -> list[str]:
    """The SHA-256 names of a call's images, in prompt order ([] for a record older than images)."""
    return [ref["sha256"] for ref in call.images or []]


def image_problem(call: CallRecord, grid: ImageGrid | None) -> str | None:
    """Why a usable call's images cannot be trained on, or None.

    >>> image_problem(CallRecord(call_index=0, prompt_token_ids=[1], images=None,
    ...                          store_error="images: image 00 is not in the store"), None)
    'its images cannot be read back (images: image 00 is not in the store)'
    >>> image_problem(CallRecord(call_index=0, prompt_token_ids=[1], images=[{"sha256": "0", "width": 9, "height": 9}]), None)
    'it has images, and no checkpoint was given (--model) to check its image tokens against their grids'
    """
    if call.images is None:
        return f"its images cannot be read back ({call.store_error})"
    images = call.images
    if grid is None:
        return "it has images, and no checkpoint was given (--model) to check its image tokens against their grids" \
            if images else None
    problem = grid.mismatch(call.prompt_token_ids, images)
    return None if problem is None else f"its image tokens do not match its images: {problem}"


def build_samples(calls: list[CallRecord | dict], grid: ImageGrid | None = None) -> RolloutSamples:
    """Merges a rollout's calls (in call order) into training samples; `calls`: records, or stored records as the
    store gives them (read with `CallRecord.from_json`); `grid`: the served checkpoint's image tokens (None for a
    text model), against which each call's images are checked.

    >>> calls = [{"call_index": 0, "status": "ok", "prompt_token_ids": [1, 2], "response_token_ids": [3],
    ...           "response_logprobs": [-0.5]},
    ...          {"call_index": 1, "status": "ok", "prompt_token_ids": [1, 2, 3, 9], "response_token_ids": [4],
    ...           "response_logprobs": [-0.25]}]
    >>> s = build_samples(calls).samples
    >>> len(s), s[0].response_token_ids, s[0].response_mask, s[0].response_logprobs
    (1, [3, 9, 4], [1, 0, 1], [-0.5, 0.0, -0.25])
    """
    result = RolloutSamples(samples=[], sample_of_call={}, continued_calls=set(), used_calls=0)
    records = [call if isinstance(call, CallRecord) else CallRecord.from_json(call) for call in calls]
    for call in sorted(records, key=lambda c: c.call_index):
        if not usable(call):
            continue
        problem = image_problem(call, grid)
        if problem is not None:
            result.untrainable[call.call_index] = problem
            continue
        result.used_calls += 1
        prompt, images = call.prompt_token_ids, image_names(call)
        matches = [i for i, sample in enumerate(result.samples) if sample.continued_by(prompt, images)]
        if matches:
            index = max(matches, key=lambda i: len(result.samples[i]))
            result.continued_calls.add(call.call_index)
        else:
            index = len(result.samples)
            result.samples.append(Sample(prompt_token_ids=list(prompt)))
        sample = result.samples[index]
        sample.append(call, list(prompt[len(sample):]), images)
        result.sample_of_call[call.call_index] = index
    return result
