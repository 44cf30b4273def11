"""One recorded run: what the page streams, scrubs, exports and replays (trace files: ``engine/trace_io.py``).

A run recorded on the page and a run imported from a trace file are the same type; an imported run
carries its own token texts (``token_text``), so it replays with no model loaded.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields

from .config import DecodeConfig
from .trace import CycleTrace
from .trace_io import export_run, load_run


@dataclass
class Run:
    """A run's record.

    Attributes:
        model: model id (never a machine path).
        prompt: the prompt text.
        prompt_format: "chat" or "raw", what the prompt went through; None when unknown (older trace files).
        config: ``DecodeConfig.to_dict()`` as used; an imported run's may not make a valid config on this
            version (``decode_config`` says why).
        traces: every cycle, prefill first (``traces[k].index == k``).
        token_text: token id -> text of an imported run; None: the loaded tokenizer decodes.
        segments: (text, label) of every output token, as the page colours it (filled by the page:
            labels are the figures' business).
        token_cycles: the cycle that committed each output token.
    """

    model: str
    prompt: str
    prompt_format: str | None
    config: dict
    traces: list[CycleTrace] = field(default_factory=list)
    token_text: dict[int, str] | None = None
    segments: list[tuple[str, str]] = field(default_factory=list)
    token_cycles: list[int] = field(default_factory=list)

    def record(self, trace: CycleTrace, segments: list[tuple[str, str]]) -> None:
        """Append one cycle and the (text, label) segments of the tokens it committed."""
        self.traces.append(trace)
        self.segments.extend(segments)
        self.token_cycles.extend([trace.index] * len(trace.new_tokens))

    def text_of(self, decode: Callable[[int], str] | None) -> Callable[[int], str]:
        """Token id -> text: the run's own table when it has one (imported), else ``decode`` (the tokenizer)."""
        if self.token_text is not None:
            table = self.token_text
            return lambda i: table.get(i, f"<{i}>")
        if decode is None:
            raise ValueError("a recorded run needs the tokenizer to show its tokens")
        return decode

    def decode_config(self) -> DecodeConfig:
        """``config`` as a ``DecodeConfig`` (JSON lists made tuples; fields this version lacks are dropped).

        Raises:
            ConfigError / TypeError: the record does not make a valid config here.
        """
        names = {f.name for f in fields(DecodeConfig)}
        return DecodeConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in self.config.items()
                               if k in names})

    def to_trace_file(self, token_text: Callable[[int], str]) -> str:
        """The run as a trace file's JSON text (``trace_io.export_run``); ``token_text`` decodes its ids."""
        return export_run(model=self.model, prompt=self.prompt, config=self.config, traces=self.traces,
                          token_text=token_text, prompt_format=self.prompt_format)

    @classmethod
    def from_trace_file(cls, data: bytes | str) -> Run:
        """A run read back from a trace file (``trace_io.load_run``; ``segments`` left for the page).

        Raises:
            TraceFormatError: too large, not JSON, another schema or version, or a malformed field.
        """
        doc = load_run(data)
        run = cls(model=doc["model"], prompt=doc["prompt"], prompt_format=doc["prompt_format"], config=doc["config"],
                  token_text=doc["token_text"])
        for trace in doc["traces"]:
            run.record(trace, [])
        return run
