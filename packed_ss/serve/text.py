"""Text out of verified tokens, with stop strings: what a response may show so far, and where it ends.

The text of a response is `decode(tokens)`, decoded whole each time tokens arrive (a token may complete a
character or merge with its neighbour), and it is shown only once it cannot change: a trailing replacement
character (a UTF-8 sequence still incomplete) is held back, and so is any tail that could be the start of a
stop string. The output ends before the first stop string, wherever the tokens split it.
"""
from __future__ import annotations


class StopText:
    def __init__(self, decode, stop: list[str]):
        self.decode, self.stop = decode, stop
        self.tokens: list[int] = []
        self.shown = 0              # characters of the text already handed out
        self.stopped = False        # a stop string was found: the text ends before it
        self.text = ""

    def add(self, tokens: list[int]) -> str:
        """New tokens; returns the text that became final (empty once stopped)."""
        if self.stopped:
            return ""
        self.tokens += tokens
        text = self.decode(self.tokens)
        cut = min((i for i in (text.find(s) for s in self.stop) if i >= 0), default=-1)
        if cut >= 0:
            self.stopped, text, safe = True, text[:cut], cut
        else:
            safe = len(text) - self._held(text)
        self.text = text
        new, self.shown = text[self.shown:max(safe, self.shown)], max(safe, self.shown)
        return new

    def finish(self) -> str:
        """The rest once the tokens have ended (nothing more can complete a stop string)."""
        rest, self.shown = self.text[self.shown:], len(self.text)
        return rest

    def _held(self, text: str) -> int:
        """Characters at the end that may still change: an incomplete character, or a prefix of a stop string."""
        held = 1 if text.endswith("\ufffd") else 0
        for s in self.stop:
            for k in range(min(len(s) - 1, len(text)), 0, -1):
                if text.endswith(s[:k]):
                    held = max(held, k)
                    break
        return held
