"""A tiny Qwen2-style model built locally in seconds: no download, same files for the same seed.

    python -m steps.tiny_model OUT_DIR [--seed 0] [--whitespace-penalty 80] [--vision [qwen2_5_vl|qwen3_vl]] [--moe]

The model is random (2 layers, hidden size 128), so it says nothing useful, but it has everything
the serving path touches: a byte-level BPE tokenizer trained on the Python standard library's own
source, Qwen's special tokens, and a hermes / Qwen2.5-style chat template with tools, so that vLLM's
`--tool-call-parser hermes` parses its forced tool calls. One deliberate bias: whitespace-only tokens
are strongly disfavoured, so that grammar-forced tool calls finish instead of padding the JSON with
whitespace until max_tokens (`--whitespace-penalty 0` builds the model without it). The tests and the
embedded default serve it.

`--vision` builds a tiny vision-language model of the Qwen-VL family instead (Qwen2.5-VL, the default, or
Qwen3-VL): the same text tokenizer plus Qwen's vision tokens, a 2-block vision tower, the PIL image
processor's `preprocessor_config.json` with a small pixel cap (a 1280x720 screenshot is 252 image tokens)
and the same chat template, which also renders each image part, in any turn (user and tool turns
included), as `<|vision_start|><|image_pad|><|vision_end|>`; text-only prompts render byte-identically.

`--moe` builds a tiny mixture-of-experts model of the Qwen3-MoE family instead (the paper's model's family):
the same tokenizer and chat template, 2 layers of 8 experts with 2 routed per token.

Determinism: the tokenizer depends only on the training text (this Python's standard library, so
the same Python version gives the same vocabulary) and the weights only on the seed.
"""

import argparse
import json
import sys
import sysconfig
from pathlib import Path

# Qwen's order: the text/chat markers are special (skipped when decoding); the tool and reasoning
# tags are ordinary added tokens, so they survive decoding and the hermes parser can see them.
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TAG_TOKENS = ["<tool_call>", "</tool_call>", "<think>", "</think>", "<tool_response>", "</tool_response>"]
EOS_TOKEN = "<|im_end|>"
PAD_TOKEN = "<|endoftext|>"
BPE_VOCAB_SIZE = 4096
# Qwen2's pre-tokenizer split: words, single digits, punctuation runs, newline runs, spaces.
QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+")
# Standard-library sources present in every CPython >= 3.11: plain English prose and Python code.
CORPUS_FILES = ["argparse.py", "asyncio/base_events.py", "collections/__init__.py", "dataclasses.py",
                "email/message.py", "functools.py", "http/client.py", "inspect.py", "json/decoder.py",
                "json/encoder.py", "logging/__init__.py", "pathlib.py", "pydoc_data/topics.py", "shutil.py",
                "subprocess.py", "textwrap.py", "typing.py", "unittest/case.py", "urllib/parse.py", "zipfile.py"]

# Qwen2.5's template, trimmed: tools go into the system turn, assistant tool calls become
# <tool_call> JSON blocks, consecutive tool results share one user turn inside <tool_response>.
CHAT_TEMPLATE = r"""
{%- macro text(content) -%}
    {%- if content is string -%}{{- content -}}
    {%- elif content -%}{%- for part in content -%}{%- if part.text is defined -%}{{- part.text -}}{%- endif -%}{%- endfor -%}
    {%- endif -%}
{%- endmacro -%}
{%- set first = messages[0] if messages else none -%}
{%- set has_system = first is not none and first.role in ['system', 'developer'] -%}
{%- if tools -%}
    {{- '<|im_start|>system\n' -}}
    {%- if has_system -%}{{- text(first.content) + '\n\n' -}}{%- endif -%}
    {{- '# Tools\n\nYou may call one or more functions to assist with the user query.\n\n' -}}
    {{- 'You are provided with function signatures within <tools></tools> XML tags:\n<tools>' -}}
    {%- for tool in tools -%}{{- '\n' + (tool | tojson) -}}{%- endfor -%}
    {{- '\n</tools>\n\nFor each function call, return a json object with function name and arguments ' -}}
    {{- 'within <tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, ' -}}
    {{- '"arguments": <args-json-object>}\n</tool_call><|im_end|>\n' -}}
{%- elif has_system -%}
    {{- '<|im_start|>system\n' + text(first.content) + '<|im_end|>\n' -}}
{%- endif -%}
{%- for message in messages -%}
    {%- if message.role in ['system', 'developer'] -%}
        {%- if not loop.first -%}{{- '<|im_start|>system\n' + text(message.content) + '<|im_end|>\n' -}}{%- endif -%}
    {%- elif message.role == 'user' -%}
        {{- '<|im_start|>user\n' + text(message.content) + '<|im_end|>\n' -}}
    {%- elif message.role == 'assistant' -%}
        {{- '<|im_start|>assistant\n' -}}
        {%- set reasoning = message.reasoning_content or message.reasoning -%}
        {%- if reasoning -%}{{- '<think>\n' + reasoning + '\n</think>\n\n' -}}{%- endif -%}
        {{- text(message.content) -}}
        {%- for call in message.tool_calls or [] -%}
            {%- set call = call.function if call.function is defined else call -%}
            {%- if loop.first and message.content -%}{{- '\n' -}}{%- elif not loop.first -%}{{- '\n' -}}{%- endif -%}
            {{- '<tool_call>\n{"name": "' + call.name + '", "arguments": ' -}}
            {{- call.arguments if call.arguments is string else (call.arguments | tojson) -}}
            {{- '}\n</tool_call>' -}}
        {%- endfor -%}
        {{- '<|im_end|>\n' -}}
    {%- elif message.role == 'tool' -%}
        {%- if loop.first or messages[loop.index0 - 1].role != 'tool' -%}{{- '<|im_start|>user' -}}{%- endif -%}
        {{- '\n<tool_response>\n' + text(message.content) + '\n</tool_response>' -}}
        {%- if loop.last or messages[loop.index0 + 1].role != 'tool' -%}{{- '<|im_end|>\n' -}}{%- endif -%}
    {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\n' -}}{%- endif -%}
""".strip()

# Qwen-VL's vision tokens, added after the text vocabulary so that every text token keeps its id.
VISION_TOKENS = ["<|vision_start|>", "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>"]
IMAGE_PLACEHOLDER = "<|vision_start|><|image_pad|><|vision_end|>"  # vLLM expands the pad to the image's tokens
TEXT_PART = "{%- if part.text is defined -%}{{- part.text -}}{%- endif -%}"
# vLLM hands the template an image part as {"type": "image"}; transformers' own rendering may keep "image_url".
VISION_PART = ("{%- if part.text is defined -%}{{- part.text -}}{%- elif part.type in ['image', 'image_url'] -%}"
               "{{- '" + IMAGE_PLACEHOLDER + "' -}}{%- endif -%}")
VISION_CHAT_TEMPLATE = CHAT_TEMPLATE.replace(TEXT_PART, VISION_PART)
# The families `--vision` builds: Qwen2.5-VL (what most open GUI agents build on) and Qwen3-VL (the production
# target). The pixel cap is 256 merged patches: a 1280x720 screenshot is 12 x 21 = 252 image tokens.
VISION_FAMILIES = {
    "qwen2_5_vl": {"patch_size": 14, "processor_class": "Qwen2_5_VLProcessor",
                   "vision_config": {"hidden_size": 64, "intermediate_size": 128, "out_hidden_size": 128,
                                     "window_size": 112, "fullatt_block_indexes": [1]},
                   "mrope": {}, "image_mean": [0.48145466, 0.4578275, 0.40821073],
                   "image_std": [0.26862954, 0.26130258, 0.27577711]},
    "qwen3_vl": {"patch_size": 16, "processor_class": "Qwen3VLProcessor",
                 "vision_config": {"hidden_size": 64, "intermediate_size": 128, "out_hidden_size": 128,
                                   "num_position_embeddings": 144, "deepstack_visual_indexes": [0]},
                 "mrope": {"mrope_interleaved": True}, "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5]},
}
MERGE_SIZE, TEMPORAL_PATCH_SIZE = 2, 2
MIN_MERGED_PATCHES, MAX_MERGED_PATCHES = 4, 256


def corpus() -> list[str]:
    """The tokenizer's training text: fixed standard-library files, in a fixed order."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    texts = [(stdlib / name).read_text(encoding="utf-8") for name in CORPUS_FILES if (stdlib / name).is_file()]
    if not texts:
        raise RuntimeError(f"none of the tokenizer's training files were found under {stdlib}")
    return texts


def build_tokenizer(out_dir: Path, vision: bool = False):
    """Trains the byte-level BPE tokenizer and saves it with the chat template (with `vision`: plus the
    vision tokens and the template that renders image parts); returns it."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=BPE_VOCAB_SIZE, min_frequency=2, show_progress=False,
                                  special_tokens=SPECIAL_TOKENS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus(), trainer=trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in TAG_TOKENS])
    if vision:
        tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in VISION_TOKENS])
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS_TOKEN, pad_token=PAD_TOKEN,
                                 model_max_length=32768, clean_up_tokenization_spaces=False)
    hf.chat_template = VISION_CHAT_TEMPLATE if vision else CHAT_TEMPLATE
    hf.save_pretrained(out_dir)
    return hf


def discourage_whitespace(model, whitespace_ids: list[int], channel: float = 2.0, penalty: float = 80.0) -> None:
    """Gives whitespace-only tokens a large negative logit bias, so forced tool calls finish.

    Constrained to JSON (a forced tool call), a random model otherwise tends to pad with whitespace
    until max_tokens. Qwen2's head has no bias, so residual channel 0 is made a constant that no layer
    reads or writes, and the (untied) head reads it only for whitespace tokens, with a negative weight.
    In a vision model an image position's channel 0 is the vision tower's, read only by that position.
    """
    import torch

    text_model = getattr(model.model, "language_model", model.model)  # a vision model's text part
    with torch.no_grad():
        embed, head = text_model.embed_tokens.weight, model.lm_head.weight
        embed[:, 0] = channel
        for layer in text_model.layers:
            layer.input_layernorm.weight[0] = 0.0
            layer.post_attention_layernorm.weight[0] = 0.0
            layer.self_attn.o_proj.weight[0].zero_()
            if hasattr(layer.mlp, "experts"):  # Qwen3-MoE: each expert's down projection, (experts, out, in)
                layer.mlp.experts.down_proj[:, 0].zero_()
            else:
                layer.mlp.down_proj.weight[0].zero_()
        head.copy_(embed)
        head[:, 0] = 0.0
        head[whitespace_ids, 0] = -penalty


def build_model(out_dir: Path, vocab_size: int, eos_id: int, pad_id: int, seed: int,
                whitespace_ids: list[int], whitespace_penalty: float = 80.0, moe: bool = False) -> None:
    """Saves a randomly initialised 2-layer Qwen2 causal LM (with `moe`: a Qwen3-MoE one; bf16 safetensors)."""
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

    common = dict(
        vocab_size=vocab_size, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32,  # vLLM's CPU attention needs 32+
        max_position_embeddings=32768, rms_norm_eps=1e-6, tie_word_embeddings=False,
        # The default init (0.02) gives near-uniform next-token distributions; a wide one makes most
        # greedy choices clear, rather than near-ties that bf16 rounding could flip between runs.
        initializer_range=0.2, bos_token_id=pad_id, eos_token_id=eos_id, pad_token_id=pad_id,
    )
    if moe:  # every layer sparse (mlp_only_layers empty), top-2 of 8 experts, weights renormalised as Qwen3-MoE's
        config = Qwen3MoeConfig(**common, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
                                moe_intermediate_size=64, num_experts=8, num_experts_per_tok=2, norm_topk_prob=True,
                                mlp_only_layers=[], decoder_sparse_step=1)
    else:
        config = Qwen2Config(**common, rope_theta=10000.0)
    torch.manual_seed(seed)
    model = (Qwen3MoeForCausalLM if moe else Qwen2ForCausalLM)(config)
    if whitespace_penalty:
        discourage_whitespace(model, whitespace_ids, penalty=whitespace_penalty)
    model = model.to(torch.bfloat16)
    model.generation_config = GenerationConfig(eos_token_id=eos_id, pad_token_id=pad_id, bos_token_id=pad_id)
    model.save_pretrained(out_dir, safe_serialization=True)


def build_vision_model(out_dir: Path, family: str, tokenizer, seed: int, whitespace_ids: list[int],
                       whitespace_penalty: float = 80.0) -> None:
    """Saves a randomly initialised Qwen-VL model of `family` (VISION_FAMILIES; bf16 safetensors): the text
    part as `build_model`'s, with mrope, and a 2-block vision tower."""
    import torch
    from transformers import AutoConfig, AutoModelForImageTextToText, GenerationConfig

    spec, ids = VISION_FAMILIES[family], {t: tokenizer.convert_tokens_to_ids(t) for t in VISION_TOKENS}
    eos_id, pad_id = tokenizer.convert_tokens_to_ids(EOS_TOKEN), tokenizer.convert_tokens_to_ids(PAD_TOKEN)
    text_config = dict(
        vocab_size=len(tokenizer), hidden_size=128, intermediate_size=256, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=32768,
        rms_norm_eps=1e-6, initializer_range=0.2, bos_token_id=pad_id, eos_token_id=eos_id, pad_token_id=pad_id,
        # mrope: the rotary half of head_dim 32 split over (time, height, width) positions
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [4, 6, 6], **spec["mrope"]},
    )
    vision_config = dict(depth=2, num_heads=2, patch_size=spec["patch_size"], spatial_merge_size=MERGE_SIZE,
                         temporal_patch_size=TEMPORAL_PATCH_SIZE, initializer_range=0.2, **spec["vision_config"])
    config = AutoConfig.for_model(
        family, text_config=text_config, vision_config=vision_config, tie_word_embeddings=False,
        image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"])
    torch.manual_seed(seed)
    model = AutoModelForImageTextToText.from_config(config)
    if whitespace_penalty:
        discourage_whitespace(model, whitespace_ids, penalty=whitespace_penalty)
    model = model.to(torch.bfloat16)
    model.generation_config = GenerationConfig(eos_token_id=eos_id, pad_token_id=pad_id, bos_token_id=pad_id)
    model.save_pretrained(out_dir, safe_serialization=True)


def save_image_processor(out_dir: Path, family: str) -> None:
    """Writes `preprocessor_config.json`: the PIL image processor (it builds offline, without torchvision)
    with the family's patch size, capped at MAX_MERGED_PATCHES merged patches per image."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    spec = VISION_FAMILIES[family]
    side = spec["patch_size"] * MERGE_SIZE  # one merged patch is side x side pixels
    processor = Qwen2VLImageProcessorPil(
        min_pixels=MIN_MERGED_PATCHES * side * side, max_pixels=MAX_MERGED_PATCHES * side * side,
        patch_size=spec["patch_size"], merge_size=MERGE_SIZE, temporal_patch_size=TEMPORAL_PATCH_SIZE,
        image_mean=spec["image_mean"], image_std=spec["image_std"])
    processor.save_pretrained(out_dir)
    path = Path(out_dir) / "preprocessor_config.json"
    saved = json.loads(path.read_text())
    saved["processor_class"] = spec["processor_class"]  # what AutoProcessor (vLLM, the update) builds
    path.write_text(json.dumps(saved, indent=2, sort_keys=True) + "\n")


def build_tiny_model(out_dir: Path, seed: int = 0, whitespace_penalty: float = 80.0, vision: str = "",
                     moe: bool = False) -> Path:
    """Builds the tiny model and tokenizer into `out_dir` (created if needed) and returns it.

    `whitespace_penalty` 0 leaves whitespace tokens unbiased. The bias hangs on one residual channel, so
    a large learning rate that rescales the residual can flip it and flood replies with whitespace;
    `benchmarks/learning_signal.py`, which trains at such a rate and forces no tool calls, uses 0.
    `vision` names a VISION_FAMILIES family: a vision-language model with its image processor instead;
    `moe` builds a Qwen3-MoE text model instead.
    """
    if vision and vision not in VISION_FAMILIES:
        raise ValueError(f"vision must be one of {', '.join(VISION_FAMILIES)}, not {vision!r}")
    if vision and moe:
        raise ValueError("vision and moe cannot be combined: the tiny mixture-of-experts model is text only")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(out_dir, vision=bool(vision))
    whitespace_ids = [i for i in range(len(tokenizer)) if tokenizer.decode([i]).isspace()]
    if vision:
        build_vision_model(out_dir, vision, tokenizer, seed, whitespace_ids, whitespace_penalty)
        save_image_processor(out_dir, vision)
        return out_dir
    build_model(out_dir, len(tokenizer), tokenizer.convert_tokens_to_ids(EOS_TOKEN),
                tokenizer.convert_tokens_to_ids(PAD_TOKEN), seed, whitespace_ids, whitespace_penalty, moe)
    return out_dir


def main(argv: list[str] | None = None) -> None:
    """Builds the model where the command line says and prints its folder."""
    p = argparse.ArgumentParser(prog="python -m steps.tiny_model", description=__doc__.split("\n\n")[0])
    p.add_argument("out_dir", type=Path)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--whitespace-penalty", type=float, default=80.0,
                   help="logit penalty on whitespace-only tokens (0: none)")
    p.add_argument("--vision", nargs="?", const="qwen2_5_vl", default="", choices=list(VISION_FAMILIES),
                   help="a vision-language model of this family instead (default family: qwen2_5_vl)")
    p.add_argument("--moe", action="store_true", help="a Qwen3-MoE model (8 experts, top-2) instead")
    args = p.parse_args(argv)
    if args.vision and args.moe:
        p.error("--vision and --moe cannot be combined: the tiny mixture-of-experts model is text only")
    path = build_tiny_model(args.out_dir, args.seed, args.whitespace_penalty, args.vision, args.moe)
    print(json.dumps({"model_dir": str(path.resolve()), "seed": args.seed,
                      "whitespace_penalty": args.whitespace_penalty, "vision": args.vision or None, "moe": args.moe}))


if __name__ == "__main__":
    sys.exit(main())
