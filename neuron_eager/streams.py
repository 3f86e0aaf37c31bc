"""`torch.neuron` streams and events on the simulated clock (device_sim/clock.py).

Kernels run at once on the host, so results never depend on streams; streams and
events only order kernels on the simulated clock, as on a NeuronCore. The current
stream is process-wide rather than per thread, so backward ops (run on autograd's
worker thread) use the stream the caller selected, as CUDA's backward does.

>>> import torch, neuron_eager
>>> s = torch.neuron.Stream()
>>> with torch.neuron.stream(s):
...     y = torch.ones(4, device="neuron") * 2
>>> torch.neuron.current_stream() == torch.neuron.default_stream()
True
"""
from __future__ import annotations

import weakref

import torch

from neuron_eager import adaptive as _adaptive
from neuron_eager.device_sim import core
from neuron_eager.device_sim.clock import SimStream

_clock = core.clock


_DEVICE = torch.device("neuron", 0)


def _check_device(device) -> torch.device:
    if device is None:
        return _DEVICE
    device = torch.device("neuron", device) if isinstance(device, int) else torch.device(device)
    if device.type != "neuron" or (device.index or 0) != 0:
        raise ValueError(f"expected the device neuron:0, got {device}")
    return _DEVICE


_by_id: weakref.WeakValueDictionary = weakref.WeakValueDictionary()  # stream_id -> Stream


def _ours(stream):
    """A torch.neuron.Stream, also for torch's generic torch.Stream naming a neuron stream
    (nn.DataParallel makes one: torch.Stream(device_index) is the default stream, id 0)."""
    if isinstance(stream, torch.Stream) and stream.device.type == "neuron":
        found = _by_id.get(stream.stream_id)
        if found is None:
            raise ValueError(f"{stream} is not a stream of this process")
        return found
    return stream


class Stream:
    """A queue of kernels on the simulated NeuronCore (torch.cuda.Stream's interface)."""

    def __init__(self, device=None, priority: int = 0, *, _sim: SimStream | None = None):
        self.device = _check_device(device)
        self._sim = _sim if _sim is not None else _clock.new_stream(priority)
        _by_id[self._sim.id] = self

    @property
    def stream_id(self) -> int:
        return self._sim.id

    @property
    def priority(self) -> int:
        return self._sim.priority

    def wait_event(self, event: Event) -> None:
        """Later work on this stream starts after `event` completes."""
        _adaptive.flush("stream wait")
        if event._time_ps is not None:
            _clock.wait_for(self._sim, event._time_ps)

    def wait_stream(self, stream: Stream) -> None:
        """Later work on this stream starts after all work queued on `stream` so far."""
        _adaptive.flush("stream wait")
        _clock.wait_for(self._sim, _clock.record_time(_ours(stream)._sim))

    def record_event(self, event: Event | None = None) -> Event:
        event = Event() if event is None else event
        event.record(self)
        return event

    def query(self) -> bool:
        """True: the simulator has already executed every kernel (only time is simulated)."""
        return True

    def synchronize(self) -> None:
        """The host waits until this stream's queued work ends on the simulated clock."""
        _adaptive.flush("synchronize")
        _clock.wait_until(self._sim.ready_ps)

    def __eq__(self, other) -> bool:
        return isinstance(other, Stream) and other._sim is self._sim

    def __hash__(self) -> int:
        return hash((Stream, self._sim.id))

    def __enter__(self) -> Stream:
        self.__dict__.setdefault("_saved", []).append(current_stream())
        set_stream(self)
        return self

    def __exit__(self, *exc) -> None:
        set_stream(self._saved.pop())

    def __repr__(self) -> str:
        return f"<torch.neuron.Stream device=neuron:0 stream_id={self.stream_id}>"


class Event:
    """A marker in a stream; with enable_timing=True, `elapsed_time` gives the simulated
    milliseconds between two events."""

    def __init__(self, enable_timing: bool = False, blocking: bool = False,
                 interprocess: bool = False):
        self.enable_timing = enable_timing
        self.blocking = blocking
        self._time_ps: float | None = None

    def record(self, stream: Stream | None = None) -> None:
        _adaptive.flush("event")
        stream = current_stream() if stream is None else _ours(stream)
        self._time_ps = _clock.record_time(stream._sim)

    def wait(self, stream: Stream | None = None) -> None:
        (current_stream() if stream is None else _ours(stream)).wait_event(self)

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        _adaptive.flush("synchronize")
        if self._time_ps is not None:
            _clock.wait_until(self._time_ps)

    def elapsed_time(self, end_event: Event) -> float:
        """Simulated milliseconds from this event to `end_event`."""
        if not (self.enable_timing and end_event.enable_timing):
            raise RuntimeError("Both events must be created with argument 'enable_timing=True'.")
        if self._time_ps is None or end_event._time_ps is None:
            raise RuntimeError("Both events must be recorded before calculating elapsed time.")
        return (end_event._time_ps - self._time_ps) / 1e9

    def __repr__(self) -> str:
        state = "unrecorded" if self._time_ps is None else f"at {self._time_ps / 1e6:.3f} us"
        return f"<torch.neuron.Event {state}>"


_default = Stream(_sim=_clock.default_stream)
_current = _default


def default_stream(device=None) -> Stream:
    _check_device(device)
    return _default


def current_stream(device=None) -> Stream:
    _check_device(device)
    return _current


def set_stream(stream: Stream) -> None:
    global _current
    if stream is None:
        return
    stream = _ours(stream)
    if stream is not _current:
        _adaptive.flush("stream change")  # recorded work belongs to the stream it came on
    _current = stream
    _clock.current = stream._sim


class StreamContext:
    """`stream` current inside the block (None: the current one stays), as
    torch.cuda.StreamContext; `torch.neuron.stream(s)` returns one."""

    def __init__(self, stream: Stream | None):
        self.stream = stream

    def __enter__(self):
        self._saved = current_stream()
        set_stream(self.stream)  # (None: nothing changes)
        return self.stream

    def __exit__(self, *exc) -> None:
        set_stream(self._saved)


def stream(stream: Stream | None) -> StreamContext:
    """Make `stream` current inside the block (None: leave the current one)."""
    return StreamContext(stream)


def is_current_stream_capturing() -> bool:
    """False: no graph capture (CUDA graphs have no counterpart here)."""
    return False


def synchronize(device=None) -> None:
    """The host waits for all queued work, on the simulated clock."""
    _check_device(device)
    _adaptive.flush("synchronize")
    _clock.synchronize()


def simulated_time_ns() -> float:
    """How far the simulated host has waited on the device, in nanoseconds."""
    _adaptive.flush("clock read")
    return _clock.host_ps / 1000
