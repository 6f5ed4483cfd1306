"""Call specs for ``kernelops tune``: lightweight descriptions of one call, tensors built on demand.

A spec holds shapes and flags only, so a preset of hundreds of calls costs nothing until a call
is tuned; :meth:`AttentionSpec.kwargs` then builds the tensors (fresh random data) for
``FlashAttention.prepare``.

Shapes: ``query [batch, seq_q, heads_q, head_dim]``, ``key/value [batch, seq_k, heads_kv, head_dim]``
(BSHD), ``heads_q`` a multiple of ``heads_kv`` (GQA ratio ``heads_q // heads_kv``).

``--shapes`` text: ``B=2,S=4096,Hq=32,Hkv=8,D=128,dtype=bf16,causal=1[,window=4096][,train=0]``
(``S`` sets both lengths, or give ``Sq`` and ``Sk``; lengths take a ``k`` suffix: ``S=8k``);
``flash_attention_fp8`` (:class:`FP8AttentionSpec`) takes the same text without dtype and train.

Parsing imports no torch (``kernelops tune --help`` and its usage errors stay fast); building
tensors does.
"""

from __future__ import annotations

import dataclasses
import datetime
from typing import ClassVar

#: spellings accepted for dtypes -> the torch dtype's name
DTYPES = {"bf16": "bfloat16", "bfloat16": "bfloat16", "fp16": "float16", "float16": "float16", "half": "float16",
          "fp32": "float32", "float32": "float32", "float": "float32", "fp8": "float8_e4m3fn", "e4m3": "float8_e4m3fn",
          "float8_e4m3fn": "float8_e4m3fn"}
_SHORT_DTYPE = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32", "float8_e4m3fn": "fp8"}
#: the largest finite e4m3 value: a tensor quantises as ``x / scale`` with ``scale = max|x| / 448``
E4M3_MAX = 448.0
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def dtype_name(text: str) -> str:
    """``"bf16"`` -> ``"bfloat16"`` (ValueError for unknown spellings)."""
    try:
        return DTYPES[text.strip().lower()]
    except KeyError:
        raise ValueError(f"unknown dtype {text!r}; use one of {', '.join(sorted(DTYPES))}") from None


def seq_text(n: int) -> str:
    """``8192`` -> ``"8k"``; lengths that are not whole kibi-tokens stay as they are."""
    return f"{n // 1024}k" if n >= 1024 and n % 1024 == 0 else str(n)


@dataclasses.dataclass(frozen=True)
class AttentionSpec:
    """One ``flash_attention`` call: ``q [batch, seq_q, heads_q, head_dim]``,
    ``k/v [batch, seq_k, heads_kv, head_dim]`` of ``dtype``; ``window`` is the ``sliding_window``
    argument (with ``causal``: ``window`` keys to the left, none to the right); ``train``: the
    tensors require grad, so the forward and the backward are tuned."""

    op_name: ClassVar[str] = "flash_attention"
    #: the dtypes the op takes
    dtypes: ClassVar[tuple[str, ...]] = ("bfloat16", "float16", "float32")

    batch: int
    seq_q: int
    seq_k: int
    heads_q: int
    heads_kv: int
    head_dim: int
    dtype: str = "bfloat16"
    causal: bool = False
    window: int | None = None
    train: bool = True

    def __post_init__(self):
        for name in ("batch", "seq_q", "seq_k", "heads_q", "heads_kv", "head_dim"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if self.heads_q % self.heads_kv:
            raise ValueError(f"heads_q={self.heads_q} must be a multiple of heads_kv={self.heads_kv} (GQA)")
        if self.dtype not in self.dtypes:
            raise ValueError(f"{self.op_name} specs take dtype {' or '.join(self.dtypes)}, got {self.dtype!r}")
        if self.window is not None and (isinstance(self.window, bool) or not isinstance(self.window, int)
                                        or self.window < 0):
            raise ValueError(f"window must be a non-negative int or None, got {self.window!r}")

    @property
    def gqa(self) -> int:
        return self.heads_q // self.heads_kv

    @property
    def seq(self) -> int:
        """The longer of the two lengths (what ``--max-seq`` filters on)."""
        return max(self.seq_q, self.seq_k)

    @property
    def mask(self) -> str:
        """``"window"``, ``"causal"`` or ``"none"``."""
        return "window" if self.window is not None else ("causal" if self.causal else "none")

    def kwargs(self, device, platform: str = "auto") -> dict:
        """Arguments for ``FlashAttention.prepare``: new random tensors on ``device``."""
        out = {**self._tensors(device), "causal": self.causal, "platform": platform}
        if self.window is not None:
            out["sliding_window"] = self.window
        return out

    def _tensors(self, device) -> dict:
        """``query``, ``key`` and ``value``: new random tensors of the spec's shapes and dtype."""
        import torch

        dtype = getattr(torch, self.dtype)

        def tensor(seq, heads):
            return torch.randn(self.batch, seq, heads, self.head_dim, device=device, dtype=dtype,
                               requires_grad=self.train)

        return {"query": tensor(self.seq_q, self.heads_q), "key": tensor(self.seq_k, self.heads_kv),
                "value": tensor(self.seq_k, self.heads_kv)}

    def summary(self, train: bool | None = None) -> str:
        """Key-level text for tables: ``bf16 D128 causal+w4096 gqa4 S8k fwd+bwd``."""
        train = self.train if train is None else train
        mask = {"none": "full", "causal": "causal"}.get(self.mask, f"{'causal+' if self.causal else ''}w{self.window}")
        seq = seq_text(self.seq_q) if self.seq_q == self.seq_k else f"{seq_text(self.seq_q)}x{seq_text(self.seq_k)}"
        return (f"{_SHORT_DTYPE[self.dtype]} D{self.head_dim} {mask} gqa{self.gqa} S{seq} "
                f"{'fwd+bwd' if train else 'fwd'}")

    def text(self) -> str:
        """The spec in ``--shapes`` syntax (round-trips through :func:`parse_attention_shape`)."""
        seq = f"S={self.seq_q}" if self.seq_q == self.seq_k else f"Sq={self.seq_q},Sk={self.seq_k}"
        out = (f"B={self.batch},{seq},Hq={self.heads_q},Hkv={self.heads_kv},D={self.head_dim},"
               f"dtype={_SHORT_DTYPE[self.dtype]},causal={int(self.causal)}")
        if self.window is not None:
            out += f",window={self.window}"
        return out + f",train={int(self.train)}"


@dataclasses.dataclass(frozen=True)
class FP8AttentionSpec(AttentionSpec):
    """One ``flash_attention_fp8`` call (forward only): e4m3 ``q/k/v`` of the shapes above, each
    quantised from fresh standard normal data with its per-tensor scale (``max|x| / 448``) passed as
    its descale factor; ``dtype`` is ``float8_e4m3fn`` and ``train`` False."""

    op_name: ClassVar[str] = "flash_attention_fp8"
    dtypes: ClassVar[tuple[str, ...]] = ("float8_e4m3fn",)

    dtype: str = "float8_e4m3fn"
    train: bool = False

    def __post_init__(self):
        super().__post_init__()
        if self.train:
            raise ValueError("flash_attention_fp8 is forward-only: its specs take train=0")

    def _tensors(self, device) -> dict:
        """e4m3 ``query``, ``key`` and ``value`` on ``device`` with their descales, as
        ``FlashAttentionFP8.prepare`` takes them (on the meta device, empty tensors and descales of 1)."""
        import torch

        meta = torch.device(device).type == "meta"

        def quantised(seq, heads):
            shape = (self.batch, seq, heads, self.head_dim)
            if meta:
                return torch.empty(shape, device=device, dtype=torch.float8_e4m3fn), 1.0
            x = torch.randn(shape, device=device)
            scale = max(float(x.abs().amax()), 1e-12) / E4M3_MAX
            return (x / scale).to(torch.float8_e4m3fn), scale

        out = {}
        for name, seq, heads in (("query", self.seq_q, self.heads_q), ("key", self.seq_k, self.heads_kv),
                                 ("value", self.seq_k, self.heads_kv)):
            out[name], out[name[0] + "_descale"] = quantised(seq, heads)
        return out


def parse_length(name: str, text: str) -> int:
    """``"8k"`` -> 8192, ``"4096"`` -> 4096 (ValueError naming ``name``)."""
    text = text.strip().lower()
    scale = 1024 if text.endswith("k") else 1
    try:
        return int(text[:-1] if scale > 1 else text) * scale
    except ValueError:
        raise ValueError(f"{name} must be an integer (e.g. 4096 or 4k), got {text!r}") from None


def parse_since(text: str) -> datetime.datetime:
    """``--resume-since``: an ISO date or date-time; without a zone it is UTC (ValueError otherwise)."""
    when = datetime.datetime.fromisoformat(text)
    return when if when.tzinfo is not None else when.replace(tzinfo=datetime.timezone.utc)


def _bool(name: str, text: str) -> bool:
    text = text.strip().lower()
    if text in _TRUE or text in _FALSE:
        return text in _TRUE
    raise ValueError(f"{name} must be 0 or 1, got {text!r}")


_FIELDS = {"b": "batch", "s": "seq", "sq": "seq_q", "sk": "seq_k", "hq": "heads_q", "hkv": "heads_kv",
           "d": "head_dim", "dtype": "dtype", "causal": "causal", "window": "window", "train": "train"}


def parse_attention_shape(text: str, spec_type: type = AttentionSpec) -> AttentionSpec:
    """``"B=2,S=4096,Hq=32,Hkv=8,D=128,dtype=bf16,causal=1"`` -> :class:`AttentionSpec`
    (ValueError naming the bad part). Required: B, S (or Sq and Sk), Hq, D; Hkv defaults to Hq,
    dtype to bf16, causal to 0, train to 1 (``spec_type``'s defaults: :func:`parse_fp8_shape`)."""
    values: dict = {}
    for part in text.split(","):
        name, sep, value = part.partition("=")
        field = _FIELDS.get(name.strip().lower())
        if not sep or field is None:
            raise ValueError(f"bad part {part!r} in {text!r}: expected NAME=VALUE with NAME one of "
                             "B, S, Sq, Sk, Hq, Hkv, D, dtype, causal, window, train")
        if field in values:
            raise ValueError(f"{name.strip()} is given twice in {text!r}")
        if field == "dtype":
            values[field] = dtype_name(value)
        elif field in ("causal", "train"):
            values[field] = _bool(name, value)
        else:
            values[field] = parse_length(name, value)
    seq = values.pop("seq", None)
    if seq is not None:
        if "seq_q" in values or "seq_k" in values:
            raise ValueError(f"give S, or Sq and Sk, not both: {text!r}")
        values["seq_q"] = values["seq_k"] = seq
    missing = [short for short, fields in (("B", ("batch",)), ("S (or Sq and Sk)", ("seq_q", "seq_k")),
                                           ("Hq", ("heads_q",)), ("D", ("head_dim",)))
               if any(f not in values for f in fields)]
    if missing:
        raise ValueError(f"{text!r} lacks {', '.join(missing)}")
    values.setdefault("heads_kv", values["heads_q"])
    return spec_type(**values)


def parse_fp8_shape(text: str) -> FP8AttentionSpec:
    """``"B=1,S=8k,Hq=32,Hkv=8,D=128,causal=1"`` -> :class:`FP8AttentionSpec` (dtype fp8 and
    train 0 by default, and only those)."""
    return parse_attention_shape(text, FP8AttentionSpec)
