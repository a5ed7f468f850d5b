"""A tiny checkpoint that always thinks first: `<think>` reasoning `</think>` answer, then its stop token.

    model_dir, chain = build_thinking_model(tmp_path / "thinking")
    chain.reasoning, chain.answer     # "The first check", " it is done"

The tiny model's tokenizer and chat template (`steps.tiny_model`), with weights set by hand: no layer writes
to the residual stream, so each next token depends on the current token alone, and the unembedding maps
the last prompt token (the newline after `assistant`) to `<think>`, `<think>` to the first reasoning word,
and so on down a fixed chain. The k-th chosen token's logit leads every other by `MARGIN` + k nats: greedy
decoding follows the chain whatever the prompt, and each position has a logprob of its own (about -0.9
down to -0.0005), so a record shifted by one token cannot match.
A random model cannot be made to think with a request field in every dialect (structured outputs are
not applied before the reasoning ends, and the Messages and Responses dialects have no such field).
"""

from dataclasses import dataclass
from pathlib import Path

from steps.tiny_model import EOS_TOKEN, build_tiny_model

MARGIN = 8.0
REASONING_WORDS = ["The", " first", " check"]
ANSWER_WORDS = [" it", " is", " done"]


@dataclass(frozen=True)
class Chain:
    """The token ids the model emits after any chat prompt, and their text."""

    token_ids: list[int]  # <think>, reasoning, </think>, answer, stop token
    reasoning: str
    answer: str


def build_thinking_model(out_dir: Path, seed: int = 0) -> tuple[Path, Chain]:
    """Builds the checkpoint into `out_dir`; returns it and the chain it emits."""
    import torch
    from transformers import AutoTokenizer, Qwen2ForCausalLM

    build_tiny_model(out_dir, seed=seed, whitespace_penalty=0)
    tokenizer = AutoTokenizer.from_pretrained(out_dir)
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True,
                                             tokenize=False)
    prompt = tokenizer.encode(rendered, add_special_tokens=False)
    ids = [_single_token(tokenizer, "<think>"), *[_single_token(tokenizer, w) for w in REASONING_WORDS],
           _single_token(tokenizer, "</think>"), *[_single_token(tokenizer, w) for w in ANSWER_WORDS],
           tokenizer.convert_tokens_to_ids(EOS_TOKEN)]
    steps = [prompt[-1], *ids]  # each token, then the one that follows it
    assert len(set(steps)) == len(steps), f"the chain repeats a token: {steps}"
    model = Qwen2ForCausalLM.from_pretrained(out_dir, torch_dtype=torch.float32)
    with torch.no_grad():
        for layer in model.model.layers:  # nothing but the current token's embedding reaches the head
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        embed, head = model.model.embed_tokens.weight, model.lm_head.weight
        hidden = embed.shape[1]
        head[:, : len(steps)] = 0.0
        for axis, (token, following) in enumerate(zip(steps, steps[1:])):
            embed[token] = 0.0
            embed[token, axis] = 1.0  # after the final RMSNorm: sqrt(hidden) along `axis`
            head[following, axis] = (MARGIN + axis) / hidden**0.5
    model.to(torch.bfloat16).save_pretrained(out_dir, safe_serialization=True)
    reasoning, answer = "".join(REASONING_WORDS), "".join(ANSWER_WORDS)
    return out_dir, Chain(ids, reasoning, answer)


def _single_token(tokenizer, text: str) -> int:
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert len(ids) == 1, f"{text!r} is {len(ids)} tokens in the tiny tokenizer, not one"
    return ids[0]
