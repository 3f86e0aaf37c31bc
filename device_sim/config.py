"""Every setting of neuron-eager, read from the environment in this one place.

`config` is a mutable object: tests and users may change fields at run time
(`neuron_eager.config.cpu_fallback = False`), except those read once at import (chip,
hbm_bytes, launch_overhead_ns, adaptive: changing them raises, naming the way). Environment
variables give the defaults when the package is imported.
"""
from __future__ import annotations

import difflib
import os
import re
from dataclasses import dataclass, field
from typing import ClassVar

_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mb": 1 << 20,
          "mib": 1 << 20, "g": 1 << 30, "gb": 1 << 30, "gib": 1 << 30}


def parse_bytes(text: str) -> int:
    """'64MiB' -> 67108864; plain integers are bytes."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", text)
    if m is None or m.group(2).lower() not in _UNITS:
        raise ValueError(f"cannot read a byte size from {text!r} "
                         f"(examples: 1073741824, 512MiB, 2GiB)")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def _flag(name: str, default: bool) -> bool:
    value = os.environ.get(name)
    if value is None or value.strip() == "":
        return default
    word = value.strip().lower()
    if word in ("1", "true", "yes", "on"):
        return True
    if word in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"{name} must be 1 or 0 (or true/false, yes/no, on/off), not {value!r}")


def _hbm_bytes() -> int | None:
    value = os.environ.get("NEURON_EAGER_HBM_BYTES")
    if not value:
        return None
    try:
        return parse_bytes(value)
    except ValueError as e:
        raise ValueError(f"NEURON_EAGER_HBM_BYTES: {e}") from None


def _nanoseconds(name: str, default: float) -> float:
    value = os.environ.get(name)
    if not value:
        return default
    try:
        return float(value)
    except ValueError:
        raise ValueError(f"{name} must be a number of nanoseconds, not {value!r}") from None


@dataclass
class Config:
    # Which chip the simulated NeuronCore belongs to: trn1, trn2 or trn3.
    chip: str = field(default_factory=lambda: os.environ.get("NEURON_EAGER_CHIP", "trn2"))
    # HBM capacity of the simulated core in bytes; None means the chip's per-core share.
    hbm_bytes: int | None = field(default_factory=_hbm_bytes)
    # Unimplemented ops run on the CPU with a warning; False makes them an error.
    cpu_fallback: bool = field(default_factory=lambda: _flag("NEURON_EAGER_CPU_FALLBACK", True))
    # The Neuron runtime's own switch for stochastic rounding of fp32 -> bf16/fp16.
    stochastic_rounding: bool = field(
        default_factory=lambda: _flag("NEURON_RT_STOCHASTIC_ROUNDING_EN", False))
    # The Neuron runtime's switch for synchronous execution.
    launch_blocking: bool = field(default_factory=lambda: _flag("NEURON_LAUNCH_BLOCKING", False))
    # Adaptive eager (fused regions) on at import.
    adaptive: bool = field(default_factory=lambda: _flag("NEURON_EAGER_ADAPTIVE", False))
    # The cost model's fixed cost of one kernel launch in simulated nanoseconds (no public
    # figure; read when the core is made: later, use core.set_cost_model).
    launch_overhead_ns: float = field(
        default_factory=lambda: _nanoseconds("NEURON_EAGER_LAUNCH_OVERHEAD_NS", 10_000))
    # The Neuron compiler's --auto-cast: which fp32 ops compute on rounded inputs
    # ("none", "matmult": matmuls and convolutions, "all": elementwise ops too) ...
    auto_cast: str = field(default_factory=lambda: os.environ.get("NEURON_EAGER_AUTO_CAST",
                                                                  "none"))
    # ... and --auto-cast-type: the type they are rounded to ("bf16", "fp16" or "tf32").
    auto_cast_type: str = field(
        default_factory=lambda: os.environ.get("NEURON_EAGER_AUTO_CAST_TYPE", "bf16"))
    # Large bf16 matmuls: "psum" sums K in chunks of 128 into an fp32 accumulator, as the
    # Tensor engine does; "cpu" runs torch's CPU bf16 GEMM (about 3x faster with AVX512-BF16
    # or AMX): still fp32 sums rounded once, but over the whole K in oneDNN's order, with
    # subnormal products flushed to zero (Note [bf16 GEMM] in ops/matmul.py).
    bf16_gemm: str = field(default_factory=lambda: os.environ.get("NEURON_EAGER_BF16_GEMM",
                                                                  "psum"))
    # Large float32 add/sub/mul/div results written with streaming stores (ops/streaming.py):
    # a host-speed setting, the bits are the same either way.
    streaming_stores: bool = field(
        default_factory=lambda: _flag("NEURON_EAGER_STREAMING_STORES", True))

    # Called before a _NUMERICS setting changes: adaptive eager runs what it recorded under
    # the old one (adaptive/recording.py), as plain eager computed each op under the setting
    # of its time.
    before_numerics_change: ClassVar[list] = []

    def __setattr__(self, name, value):
        _check_setting(name, value)
        if name in _read and value != getattr(self, name):
            raise ValueError(f"neuron_eager.config.{name} was read when neuron_eager was "
                             f"imported; {_AT_IMPORT[name]}")
        if name in _CHOICES and value not in _CHOICES[name][0]:
            choices, env = _CHOICES[name]
            raise ValueError(f"neuron_eager.config.{name} (environment {env}) must be one of "
                             f"{', '.join(map(repr, choices))}, not {value!r}")
        if name in _NUMERICS and hasattr(self, name) and value != getattr(self, name):
            for hook in self.before_numerics_change:  # (what was recorded under the old
                hook()                                # setting runs first)
        super().__setattr__(name, value)
        if name in _NUMERICS:  # one value for kernel caches to key on
            super().__setattr__("numerics_key", tuple(getattr(self, n, None) for n in _NUMERICS))


# Settings read once, at import: changing them later would silently do nothing.
_AT_IMPORT = {
    "chip": "set NEURON_EAGER_CHIP before importing it (the simulated core is made then)",
    "hbm_bytes": "set NEURON_EAGER_HBM_BYTES before importing it (the simulated core is made "
                 "then)",
    "launch_overhead_ns": "set NEURON_EAGER_LAUNCH_OVERHEAD_NS before importing it, or give "
                          "the core a new cost model (device_sim.core.set_cost_model)",
    "adaptive": "switch adaptive eager with neuron_eager.adaptive.enable() and disable(), or "
                "`with neuron_eager.adaptive_eager():`",
}
_read: set = set()  # the _AT_IMPORT settings read so far


def read_at_import(*names: str) -> None:
    """Mark settings as read: a later change raises, naming the way to change them."""
    _read.update(names)


_CHOICES = {"auto_cast": (("none", "matmult", "all"), "NEURON_EAGER_AUTO_CAST"),
            "auto_cast_type": (("bf16", "fp16", "tf32"), "NEURON_EAGER_AUTO_CAST_TYPE"),
            "bf16_gemm": (("psum", "cpu"), "NEURON_EAGER_BF16_GEMM")}
_NUMERICS = ("stochastic_rounding", "auto_cast", "auto_cast_type")
_ENV = {"cpu_fallback": "NEURON_EAGER_CPU_FALLBACK", "launch_blocking": "NEURON_LAUNCH_BLOCKING",
        "stochastic_rounding": "NEURON_RT_STOCHASTIC_ROUNDING_EN",
        "adaptive": "NEURON_EAGER_ADAPTIVE", "streaming_stores": "NEURON_EAGER_STREAMING_STORES",
        "hbm_bytes": "NEURON_EAGER_HBM_BYTES",
        "launch_overhead_ns": "NEURON_EAGER_LAUNCH_OVERHEAD_NS"}


def _check_setting(name: str, value) -> None:
    """Refuse a setting that does not exist or a value of the wrong kind: `config.cpu_falback
    = False` or `config.cpu_fallback = "0"` (a true string) would otherwise do nothing, or
    the opposite, without a word."""
    kind = Config.__annotations__.get(name)
    if kind is None:
        if name == "numerics_key":
            return
        close = difflib.get_close_matches(name, Config.__annotations__, 1)
        raise AttributeError(f"neuron_eager.config has no setting {name!r}" +
                             (f"; did you mean {close[0]!r}?" if close else ""))
    where = f"neuron_eager.config.{name}" + (f" (environment {_ENV[name]})" if name in _ENV
                                             else "")
    if kind == "bool" and type(value) is not bool:
        raise TypeError(f"{where} must be True or False, not {value!r}")
    if name == "launch_overhead_ns" and not (isinstance(value, (int, float)) and value >= 0):
        raise ValueError(f"{where} must be a number of nanoseconds >= 0, not {value!r}")
    if name == "hbm_bytes" and value is not None and not (type(value) is int and value > 0):
        raise ValueError(f"{where} must be a positive number of bytes, not {value!r}")


config = Config()
