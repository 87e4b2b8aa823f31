"""Per-stage timing of DLRM inference.

A forward pass has four stages: the bottom MLP (dense arch), the embedding lookups (sparse
arch), the interaction and the top MLP (over arch). When the lookups overlap the bottom MLP
(they run in a worker thread), the stage times add up to more than the wall time; the
difference is the time the overlap saved, ``overlap_s``.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, fields

__all__ = ["StageTimes", "Profiler", "STAGES"]

STAGES = ("bottom_s", "embeddings_s", "interaction_s", "top_s")


@dataclass
class StageTimes:
    """Seconds spent per stage by one forward pass (or summed over several).

    ``wait_s`` is how long the main thread waited for the lookups after its bottom MLP was
    done; ``wall_s`` is the whole call; ``overlapped`` says whether lookups ran concurrently.
    """

    bottom_s: float = 0.0
    embeddings_s: float = 0.0
    interaction_s: float = 0.0
    top_s: float = 0.0
    wait_s: float = 0.0
    wall_s: float = 0.0
    batches: int = 0
    samples: int = 0
    overlapped: bool = False

    @property
    def serial_s(self) -> float:
        """Sum of the four stage times: the wall time had nothing overlapped."""
        return self.bottom_s + self.embeddings_s + self.interaction_s + self.top_s

    @property
    def overlap_s(self) -> float:
        """Time saved by running lookups beside the bottom MLP (``serial_s - wall_s``, >= 0)."""
        return max(0.0, self.serial_s - self.wall_s)

    def add(self, other: "StageTimes") -> None:
        for f in fields(self):
            if f.name == "overlapped":
                self.overlapped = self.overlapped or other.overlapped
            else:
                setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    def as_dict(self) -> dict:
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d["serial_s"] = self.serial_s
        d["overlap_s"] = self.overlap_s
        return d


class Profiler:
    """Collects :class:`StageTimes` of every forward pass it is given to (thread-safe).

    ``model.forward(..., profile=prof)`` appends one record; ``prof.total`` sums them and
    ``prof.records`` keeps each call's times.
    """

    def __init__(self):
        self._lock = threading.Lock()
        self.records: list[StageTimes] = []

    def record(self, times: StageTimes) -> None:
        with self._lock:
            self.records.append(times)

    def reset(self) -> None:
        with self._lock:
            self.records.clear()

    @property
    def total(self) -> StageTimes:
        out = StageTimes()
        with self._lock:
            for r in self.records:
                out.add(r)
        return out

    def summary(self) -> str:
        """One line per stage: total seconds and share of the wall time."""
        t = self.total
        wall = t.wall_s or 1.0
        lines = [f"{name[:-2]:<12} {getattr(t, name) * 1e3:10.2f} ms  {100 * getattr(t, name) / wall:5.1f}%"
                 for name in STAGES]
        lines.append(f"{'wall':<12} {t.wall_s * 1e3:10.2f} ms  (serial {t.serial_s * 1e3:.2f} ms, "
                     f"overlap saved {t.overlap_s * 1e3:.2f} ms, {t.batches} batches)")
        return "\n".join(lines)
