"""Which tool-call and reasoning parsers vLLM knows, and which tool-call parser a model family needs.

    tool_call_parser_for(Path("runs/tiny-model"))      # 'hermes': its config.json says model_type qwen2

The names are vLLM 0.32's registries (`ToolParserManager`, `ReasoningParserManager`), written out so that
checking a run config never imports vLLM; `tests/test_serving_options.py` compares them with the installed
vLLM. A family missing from `FAMILY_TOOL_CALL_PARSER` is an error naming `tool_call_parser`, never a
silent guess: a wrong parser leaves every tool call in the text, and the agent never acts.
"""

import json
from pathlib import Path

TOOL_CALL_PARSERS = frozenset({
    "apertus", "cohere_command3", "cohere_command4", "deepseek_v3", "deepseek_v31", "deepseek_v32", "deepseek_v4",
    "deepseek_v41", "dots", "ernie45", "functiongemma", "gemma4", "gigachat3", "glm45", "glm47", "granite",
    "granite-20b-fc", "granite4", "hermes", "hf", "hunyuan_a13b", "hy_v3", "hy_v4", "inkling", "internlm", "jamba",
    "k2_horizon", "kimi_k2", "kimi_k3", "lfm2", "ling3", "llama3_json", "llama4_json", "llama4_pythonic", "longcat",
    "mimo", "minicpm5", "minimax_m2", "minimax_m3", "mistral", "muse_glimmer", "olmo3", "openai", "phi4_mini_json",
    "plamo3", "poolside_v1", "pythonic", "qwen3_coder", "qwen3_json", "qwen3_xml", "seed_oss", "step3", "step3p5",
    "xlam",
})
REASONING_PARSERS = frozenset({
    "cohere_command3", "cohere_command4", "deepseek_r1", "deepseek_v3", "deepseek_v4", "deepseek_v41", "ernie45",
    "gemma4", "glm45", "glm47", "granite", "granite_thinking_parser", "hf", "holo2", "hunyuan_a13b", "hy_v3", "hy_v4",
    "inkling", "k2_horizon", "kimi_k2", "kimi_k3", "ling3", "mimo", "minicpmv", "minimax_m2",
    "minimax_m2_append_think", "minimax_m3", "mistral", "muse_glimmer", "nemotron_v3", "olmo3", "openai_gptoss",
    "plamo3", "poolside_v1", "qwen3", "seed_oss", "step3", "step3p5",
})
# config.json's `model_type` -> the tool-call parser its chat template's tool calls need (vLLM's tool
# calling docs). Qwen2.5 and Qwen3 write hermes-style <tool_call> JSON; Qwen3-Coder checkpoints share
# Qwen3's model types but write XML: they must set `tool_call_parser: qwen3_coder`.
FAMILY_TOOL_CALL_PARSER = {
    "qwen2": "hermes", "qwen2_moe": "hermes", "qwen3": "hermes", "qwen3_moe": "hermes", "qwen3_next": "hermes",
    "qwen2_vl": "hermes", "qwen2_5_vl": "hermes", "qwen3_vl": "hermes", "qwen3_vl_moe": "hermes",
    "llama": "llama3_json", "llama4": "llama4_pythonic", "mistral": "mistral", "mixtral": "mistral",
    "deepseek_v3": "deepseek_v3", "kimi_k2": "kimi_k2", "glm4_moe": "glm45", "gpt_oss": "openai",
    "granite": "granite", "internlm2": "internlm", "jamba": "jamba", "minimax_m2": "minimax_m2",
    "seed_oss": "seed_oss", "hunyuan_v1_moe": "hunyuan_a13b", "ernie4_5_moe": "ernie45", "olmo3": "olmo3",
}


class UnknownFamily(ValueError):
    """The checkpoint's family has no known tool-call parser; the message is one sentence for the user."""


def model_family(model: Path) -> tuple[str, list[str]] | None:
    """`model_type` and `architectures` from the checkpoint folder's config.json; None when it cannot be read
    (a hub name is not looked up: the serve pod may have no way out)."""
    try:
        config = json.loads((Path(model) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    return str(config.get("model_type") or ""), list(config.get("architectures") or [])


def tool_call_parser_for(model: Path) -> str:
    """The tool-call parser of the checkpoint's family; `UnknownFamily` when the family is not mapped."""
    family = model_family(model)
    if family is not None and family[0] in FAMILY_TOOL_CALL_PARSER:
        return FAMILY_TOOL_CALL_PARSER[family[0]]
    if family is None:
        seen = f"the checkpoint {model} has no config.json to tell its family (a hub name is not looked up)"
    else:
        seen = f"no tool-call parser is known for the checkpoint {model}'s model_type {family[0]!r}"
        seen += f" ({', '.join(family[1])})" if family[1] else ""
    raise UnknownFamily(f"{seen}; set tool_call_parser to the one its chat template needs, "
                        f"e.g. hermes, llama3_json, mistral or qwen3_coder")
