"""What runs a loaded model's forwards: the weights, their type and the forward path, as one decision.

A model has two choices behind it: its precision (``precision.py``: the transformers model in fp32, bf16, fp16 or
q4) and its forward path (``forward_choice.py``: eager, static, compiled, graphed, or llama.cpp's kernels on the
model's own GGUF file).  They are not independent: llama.cpp's paths run the file's own blocks (e.g. Q4_1), never the
torch model's dtype.  So the rule is one (``allows_file_paths``): only a precision chosen by measurement ("auto") may
be served by a path that runs the file's weights; a precision the user named ("fp32": the exact mode) runs on torch's
kernels in that precision.  And the record of what ran is one (``WhatRuns``), which every entry point shows the same
way: the model line, the command line's JSON, the benchmark's meta and rows, trace files and the page.
"""
from __future__ import annotations

from dataclasses import dataclass


def allows_file_paths(auto_dtype: bool) -> bool:
    """Whether a path that runs the model file's own weights (llama.cpp's) may serve a model whose precision was
    chosen so: only under "auto" (``auto_dtype``), where the fastest measured way to run this model is wanted; a
    named precision ("fp32", "bf16", "q4") is the precision that runs."""
    return auto_dtype


@dataclass(frozen=True)
class WhatRuns:
    """What ran a run's forwards, for every record of it.

    Attributes:
        dtype: the weight type that ran: "fp32", "bf16", "fp16" or "q4" (the transformers model on torch's kernels),
            or the GGUF file's type on llama.cpp's kernels, e.g. "Q4_1".
        forward_path: the registered forward path's name, e.g. "eager", "static", "llamacpp-q8cache".
        weights: "transformers" (the converted model's tensors) or "gguf" (the GGUF file's own blocks).
    """

    dtype: str
    forward_path: str
    weights: str

    @classmethod
    def of(cls, precision: str, path) -> WhatRuns:
        """What runs a model of ``precision`` (``LoadedModel.precision``) on the ``ForwardPath`` ``path``."""
        own = path.weights()  # None: the transformers model in its own dtype runs
        return cls(own or precision, path.name, "gguf" if own else "transformers")

    @property
    def label(self) -> str:
        """Short words for a line, e.g. "Q4_1 · llama.cpp kernels (llamacpp-q8cache)", "fp32 · eager"."""
        if self.weights == "gguf":
            return f"{self.dtype} · llama.cpp kernels ({self.forward_path})"
        return f"{self.dtype} · {self.forward_path}"

    def to_dict(self) -> dict:
        """{"dtype", "forward_path", "weights"}: the fields a JSON record of a run carries."""
        return {"dtype": self.dtype, "forward_path": self.forward_path, "weights": self.weights}
