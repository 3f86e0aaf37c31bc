"""The simulated clock: streams, engines, the host's view of time, and launch records.

Kernels execute eagerly and synchronously; only this clock models asynchrony. A launch
starts when its stream, its engine and the host are all ready:
start = max(stream.ready, engine.free, host), and ends `duration` later. So kernels on
two streams overlap unless they share an engine or an event orders them. Under
NEURON_LAUNCH_BLOCKING=1 the host waits for every launch, which serialises everything.
Times are integer picoseconds from process start (integers, so that the same kernels
give the same elapsed times wherever they fall); the same program gives the same times.
"""
from __future__ import annotations

import time

from .config import config

ENGINES = ("tensor", "vector", "scalar", "gpsimd", "dma")


class SimStream:
    """One queue of kernels: `ready_ps` is when its last queued kernel ends."""

    __slots__ = ("id", "priority", "ready_ps")

    def __init__(self, stream_id: int, priority: int = 0):
        self.id = stream_id
        self.priority = priority
        self.ready_ps = 0


class Record:
    """One launch as the profiler sees it (kept only while recording)."""

    __slots__ = ("op", "source", "engine", "stream", "start_ps", "end_ps", "cost", "elements",
                 "nbytes", "wall_ns", "hbm_allocated", "hbm_reserved")

    def __init__(self, op, source, engine, stream, start_ps, end_ps, cost, elements, nbytes,
                 wall_ns, hbm_allocated, hbm_reserved):
        self.op, self.source, self.engine, self.stream = op, source, engine, stream
        self.start_ps, self.end_ps, self.cost = start_ps, end_ps, cost
        self.elements, self.nbytes, self.wall_ns = elements, nbytes, wall_ns
        self.hbm_allocated, self.hbm_reserved = hbm_allocated, hbm_reserved

    @property
    def start_ns(self) -> float:
        return self.start_ps / 1000

    @property
    def end_ns(self) -> float:
        return self.end_ps / 1000


class Clock:
    """Streams and engine timelines of one NeuronCore.

    >>> clock = Clock()
    >>> clock.schedule("vector", 5000), clock.schedule("tensor", 2000)
    ((0, 5000), (5000, 7000))
    """

    def __init__(self):
        self.default_stream = SimStream(0)
        self.current = self.default_stream
        self._next_id = 1
        self.host_ps = 0  # how far the host has waited on the device
        self.last_end_ps = 0  # end of the latest-ending kernel on any stream
        self.engine_free = dict.fromkeys(ENGINES, 0)
        self.busy_ps = dict.fromkeys(ENGINES, 0)
        # The profiler's view: a list while recording, else None. `context` is the
        # (op, source line) the front end says is launching; opaque to this layer.
        self.records: list[Record] | None = None
        self.context = None

    def new_stream(self, priority: int = 0) -> SimStream:
        stream = SimStream(self._next_id, priority)
        self._next_id += 1
        return stream

    def schedule(self, engine: str, duration: int) -> tuple[int, int]:
        """Place a kernel of `duration` ps on the current stream; returns (start, end)."""
        stream = self.current
        free = self.engine_free
        start = stream.ready_ps
        if free[engine] > start:
            start = free[engine]
        if self.host_ps > start:
            start = self.host_ps
        end = start + duration
        stream.ready_ps = free[engine] = end
        self.busy_ps[engine] += duration
        if end > self.last_end_ps:
            self.last_end_ps = end
        if config.launch_blocking:
            self.host_ps = end
        return start, end

    # -- host synchronisation -------------------------------------------------------------
    def synchronize(self) -> int:
        """The host waits for every stream; returns the host time."""
        if self.last_end_ps > self.host_ps:
            self.host_ps = self.last_end_ps
        return self.host_ps

    def wait_until(self, t_ps: int) -> None:
        if t_ps > self.host_ps:
            self.host_ps = t_ps

    def record_time(self, stream: SimStream) -> int:
        """When an event recorded now on `stream` completes."""
        return max(stream.ready_ps, self.host_ps)

    @staticmethod
    def wait_for(stream: SimStream, t_ps: int) -> None:
        """Work queued on `stream` from now on starts no earlier than `t_ps`."""
        if t_ps > stream.ready_ps:
            stream.ready_ps = t_ps

    # -- recording for the profiler -------------------------------------------------------
    def start_recording(self) -> None:
        self.records = []

    def stop_recording(self) -> list[Record]:
        records, self.records = self.records or [], None
        return records

    def record(self, engine, start, end, cost, elements, nbytes, hbm) -> None:
        op, source = self.context if self.context is not None else (None, None)
        self.records.append(Record(op, source, engine, self.current.id, start, end, cost,
                                   elements, nbytes, time.time_ns(), hbm.allocated,
                                   hbm.reserved))
