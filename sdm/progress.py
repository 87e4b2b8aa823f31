"""Progress of a long step, on a terminal or not.

:func:`progress_bar` is the one place a progress display is made. On a terminal it is a tqdm
bar. Elsewhere (CI, a pipe, a log file) a bar's carriage returns would pile up on one line,
so it prints a plain line instead, at most every :data:`LINE_INTERVAL_S` seconds, and a last
line when a step that printed one ends; a step shorter than that prints nothing.
"""

from __future__ import annotations

import sys
import time

from tqdm.auto import tqdm

__all__ = ["progress_bar", "LINE_INTERVAL_S"]

#: Seconds between two progress lines when stderr is not a terminal.
LINE_INTERVAL_S = 10.0


class _Lines:
    """tqdm's ``update`` / ``set_postfix_str`` / ``close`` as a line every interval."""

    def __init__(self, total, desc: str, unit: str, stream):
        self.total, self.desc, self.unit, self.stream = total, desc, unit, stream
        self.n = 0
        self.postfix = ""
        self.start = self.last = time.monotonic()
        self.printed = False

    def _line(self) -> None:
        done = f"{self.n:,}" + (f" of {self.total:,} ({self.n / self.total:.0%})" if self.total else "")
        extra = f", {self.postfix}" if self.postfix else ""
        print(f"{self.desc}: {done} {self.unit}s, {time.monotonic() - self.start:.0f} s{extra}",
              file=self.stream, flush=True)
        self.printed = True

    def update(self, n: int = 1) -> None:
        self.n += n
        now = time.monotonic()
        if now - self.last >= LINE_INTERVAL_S:
            self.last = now
            self._line()

    def set_postfix_str(self, text: str, refresh: bool = True) -> None:
        self.postfix = text

    def close(self) -> None:
        if self.printed:
            self._line()


def progress_bar(*, total=None, desc: str, unit: str = "it", show: bool | None = None,
                 unit_scale: bool = False, leave: bool = False, stream=None):
    """A progress display with tqdm's ``update(n)``, ``set_postfix_str(s)`` and ``close()``.

    ``show``: None shows a bar only on a terminal (a library call stays quiet in a pipe);
    True shows one everywhere, as lines off a terminal; False shows nothing. ``stream``:
    where it goes (default stderr).
    """
    stream = sys.stderr if stream is None else stream
    tty = hasattr(stream, "isatty") and stream.isatty()
    if show is False or (show is None and not tty):
        return tqdm(total=total, disable=True)
    if tty:
        return tqdm(total=total, desc=desc, unit=unit, unit_scale=unit_scale, leave=leave, file=stream)
    return _Lines(total, desc, unit, stream)
