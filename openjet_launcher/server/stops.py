"""Stop strings over streamed text: the text before the first stop string goes out, the stop string and
everything after it never do, and a suffix that could still begin a stop string is held back until the
next text says it cannot (so no partial stop string is ever emitted)."""

from __future__ import annotations

from collections.abc import Sequence


class StopStringMatcher:
    def __init__(self, stops: Sequence[str] = ()):
        self.stops = tuple(s for s in stops if s)
        self._buf = ""
        self.stopped = False
        self.matched: str | None = None      # the stop string that ended the text

    def push(self, text: str) -> str:
        """The text that is now safe to emit; sets `stopped` when a stop string completed."""
        if self.stopped:
            return ""
        if not self.stops:
            return text
        self._buf += text
        hits = [(i, s) for s in self.stops if (i := self._buf.find(s)) >= 0]
        if hits:
            at, self.matched = min(hits)
            out, self._buf, self.stopped = self._buf[:at], "", True
            return out
        hold = self._held_suffix()
        out = self._buf[: len(self._buf) - hold]
        self._buf = self._buf[len(self._buf) - hold:]
        return out

    def flush(self) -> str:
        """End of output: a held-back suffix that never became a stop string is text."""
        out, self._buf = ("" if self.stopped else self._buf), ""
        return out

    def _held_suffix(self) -> int:
        """Length of the longest suffix of the buffer that is a proper prefix of a stop string."""
        best = 0
        for s in self.stops:
            for k in range(min(len(s) - 1, len(self._buf)), best, -1):
                if self._buf.endswith(s[:k]):
                    best = k
                    break
        return best
