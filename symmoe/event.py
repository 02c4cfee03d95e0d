"""DeepEP-shaped event handle returned by the asynchronous calls."""
from __future__ import annotations

import torch


class EventOverlap:
    """Wraps the CUDA event recorded after a call (None on the CPU, where calls are synchronous)."""

    def __init__(self, event: "torch.cuda.Event | None" = None):
        self.event = event

    @classmethod
    def record(cls, device: torch.device) -> "EventOverlap":
        if device.type != "cuda":
            return cls(None)
        ev = torch.cuda.Event()
        ev.record(torch.cuda.current_stream(device))
        return cls(ev)

    def current_stream_wait(self) -> None:
        if self.event is not None:
            torch.cuda.current_stream().wait_event(self.event)

    def synchronize(self) -> None:
        if self.event is not None:
            self.event.synchronize()
