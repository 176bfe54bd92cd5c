"""llama-server's ``n_indent`` (code completion): every line after the first must open
with at least ``n`` spaces or tabs. Generation stops at the first other character of a
line that has fewer, and the text is cut there, the line's indentation kept. As in
llama-server, an empty line counts as a line with no indentation: it stops too."""

from __future__ import annotations


class IndentLimit:
    def __init__(self, n: int):
        self.n = n
        self.open = False  # a newline was written and the line since holds only spaces and tabs
        self.indent = 0  # ... this many of them

    def push(self, text: str) -> int | None:
        """Where the limit cuts this piece of output (None: all of it stands)."""
        for i, c in enumerate(text):
            if self.open and c not in " \t":
                if self.indent < self.n:
                    return i
                self.open = False
            if c == "\n":
                self.open, self.indent = True, 0
            elif self.open:
                self.indent += 1
        return None
