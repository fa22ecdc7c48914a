"""Notebook 06: the check of its exercise, saving the weights of a DataParallel model so that the plain
model loads them."""

from __future__ import annotations

from pathlib import Path

import torch

from course_utils.training.models import build

WRAPPER_PREFIX = "module."  # DataParallel (and DDP) keep the model as their attribute "module"


def check_plain_load(path: str | Path, model: str) -> str:
    """Does the state dict saved at ``path`` load, strictly, into a fresh ``model`` without any wrapper?"""
    saved = torch.load(path, map_location="cpu", weights_only=True)
    wrapped = [name for name in saved if name.startswith(WRAPPER_PREFIX)]
    try:
        build(model).load_state_dict(saved, strict=True)
    except RuntimeError as error:
        if wrapped:
            return (f"Not yet: {len(wrapped)} of {len(saved)} names begin with {WRAPPER_PREFIX!r} "
                    f"(e.g. {wrapped[0]!r}), the wrapper's attribute, so the plain model does not know them. "
                    "Save the wrapped model's module instead.")
        return f"Not yet: the plain model refuses these weights: {str(error).splitlines()[0]}"
    return (f"Done: all {len(saved)} tensors loaded into a plain {model}: the checkpoint no longer depends on the "
            "wrapper, so one GPU, DDP or evaluation can read it.")
