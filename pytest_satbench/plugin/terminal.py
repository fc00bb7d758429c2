"""The terminal: the summary, and the live progress line.

The summary: per benchmark the tables of `core.text_summary`, then one line on where the
answers came from. Everything shown is computed from the store's rows by `core.results`,
the same records the gates and the report files use.

The progress line (`StatusLine`, `write_plain_line`): how the line `plugin/progress.py`
makes reaches the screen, rewritten in place on a terminal, a plain line in a log."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from pytest_satbench.core import formatting as F
from pytest_satbench.core import text_summary
from pytest_satbench.core.results import BenchmarkResult


def render(tr: Any, results: Sequence[BenchmarkResult], model: str | None, sent: int | None = None) -> None:
    """`sent`: the requests this run's clients sent (None: not recorded)."""
    if not results:
        return
    for result in results:
        tr.write_sep("=", f"satbench: {result.benchmark}")
        for line in text_summary.render(result):
            tr.write_line(line)
        from pytest_satbench.report.budget import budget_lines  # an --nlatent sweep: a line per budget

        for line in budget_lines(result):
            tr.write_line(line)
    asked = sum(r.usage.asked for r in results)
    reused = sum(r.usage.reused for r in results)
    earlier = sum(r.usage.earlier for r in results)
    text = f"answers: {asked} asked this run, {reused} reused from the store" + (
        f", {earlier} more from the tag's earlier runs (questions or arms this run did not ask)" if earlier else "") + (
        f"; model {model}" if model else "")
    # the run's traffic is one figure for all its benchmarks
    if sent is not None and sent != asked:
        text += (f"; {sent} requests sent (failed attempts and retries count, and so do answers fetched ahead "
                 "for items a stopped run did not reach: those are stored for the next run)")
    for line in F.prose(text):
        tr.write_line(line)


# ---------------------------------------------------------------------- the progress line
# `plugin/progress.py` decides what the line says and when; this is how it reaches the screen.

CSI = "\x1b["
SAVE, RESTORE = "\x1b7", "\x1b8"  # DECSC/DECRC: the cursor's position
MIDDLE_DOT = " · "


def can_rewrite(reporter: Any) -> bool:
    """Whether the line can be rewritten in place: pytest writes to a terminal that
    understands cursor movement (not TERM=dumb), through the writer `StatusLine` expects."""
    tw = getattr(reporter, "_tw", None)
    file = getattr(tw, "_file", None)
    if file is None or not isinstance(getattr(tw, "_current_line", None), str):
        return False
    try:
        tty = bool(file.isatty())
    except (AttributeError, ValueError, OSError):
        return False
    return tty and os.environ.get("TERM", "") != "dumb"


def separator(tw: Any) -> str:
    """The middle dot, or ' | ' where the output's encoding has none (LANG=C)."""
    encoding = getattr(getattr(tw, "_file", None), "encoding", None) or "ascii"
    try:
        MIDDLE_DOT.encode(encoding)
    except (UnicodeEncodeError, LookupError):
        return " | "
    return MIDDLE_DOT


def write_plain_line(reporter: Any, text: str) -> None:
    """The line as a line of its own, for logs (CI, SLURM): pytest's current line (dots) is
    ended first, as pytest ends it for any line written mid-run."""
    reporter.ensure_newline()  # -v and the default: ends the line pytest left open
    tw = reporter._tw
    if tw.width_of_current_line:  # -q: dots, which ensure_newline leaves open
        tw.line()
    tw.line(text)
    tw.flush()


class StatusLine:
    """A status line under pytest's current line on a terminal, rewritten in place.

    Layout: pytest's current line (dots, or a -v line) is where it always is, with the cursor
    at its end; the status sits on the row below, which pytest has not reached yet. Each draw
    writes the status there and moves the cursor back to where pytest left it, so what pytest
    writes next on its line lands exactly where it would without the status, and the status
    is not rewritten per item. Only a write that moves pytest onto the next row (a newline, a
    carriage return, or a line that wraps) would reach the status: `_Tee`, put between
    pytest's terminal writer and its file, erases the status before such a write and draws
    it again under pytest's new line after it. So no write through pytest's terminal writer
    (pytest's, xdist's, a plugin's `write_line`) ever lands on the status, and the status is
    never seen half overwritten.

    Sequences used (VT100/ECMA-48: every terminal emulator and multiplexer): `CSI K` erase to
    the end of the line, `CSI A`/`CSI B` one row up/down, `CSI n G` to column n, `ESC 7`/
    `ESC 8` save/restore the cursor.

    Limits: output that bypasses pytest's writer (a test's print under `-s`, a thread
    writing to stderr) can overwrite the status until its next refresh; the items with
    pytest's own runtest (your tests, which may print) run with the status erased
    (`progress.ProgressPlugin.pytest_runtest_protocol`).
    """

    def __init__(self, tw: Any) -> None:
        self._tw = tw
        self._file = tw._file
        self._text: str | None = None
        self.drawn = False
        self._cols = 80  # the terminal's width when drawn
        self._width = 0  # the width of pytest's current line when drawn
        self._tee = _Tee(self, self._file)
        tw._file = self._tee

    # ------------------------------------------------------------------ public
    def show(self, text: str) -> None:
        """Draw `text`, or replace the text shown, in place."""
        self._text = text
        self._draw()
        self._file.flush()

    def redraw(self) -> None:
        if self._text is not None and not self.drawn:
            self._draw()
            self._file.flush()

    def hide(self) -> None:
        if self.drawn:
            self._erase()
            self._file.flush()

    def close(self) -> None:
        """Erase the status and give pytest its writer back."""
        self.hide()
        self._text = None
        if self._tw._file is self._tee:
            self._tw._file = self._file

    # ------------------------------------------------------------------ internals
    def _line_width(self) -> int:
        line: str = self._tw._current_line
        if "\r" in line:
            line = line.rsplit("\r", 1)[-1]
        # dots and node ids are ASCII: len is exact and costs nothing; else pytest's wcwidth
        return len(line) if line.isascii() else max(0, int(self._tw.width_of_current_line))

    def columns(self) -> int:
        # the terminal's own width: pytest's `fullwidth` says 80 below 40 columns, or COLUMNS
        try:
            cols = os.get_terminal_size(self._file.fileno()).columns
        except (AttributeError, ValueError, OSError):
            cols = int(self._tw.fullwidth)
        return max(2, cols)

    def _draw(self) -> None:
        if self._text is None:
            return
        cols = self.columns()
        width = self._line_width()
        if width and width % cols == 0:
            # pytest's line ends in the last column: the terminal wraps at its next character,
            # and no column to go back to says that; drawn at the next refresh
            if self.drawn:
                self._erase()
            return
        text = self._text[: cols - 1]  # never wraps: the erase clears exactly one row
        if self.drawn:  # in place: the cursor is saved and restored (DECSC/DECRC)
            self._file.write(SAVE + CSI + "B\r" + text + CSI + "K" + RESTORE)
            return
        # The row below does not exist yet: a newline makes it (scrolling if need be, which
        # would move a saved position), then back up to pytest's column, known right now.
        self._cols, self._width = cols, width
        col = width % cols
        back = CSI + "A" + ("\r" if col == 0 else f"{CSI}{col + 1}G")
        self._file.write(CSI + "K\r\n" + text + CSI + "K" + back)
        self.drawn = True

    def _erase(self) -> None:
        # pytest may have written on its line since the draw: its cursor is saved, not computed
        self._file.write(SAVE + CSI + "B\r" + CSI + "K" + RESTORE)
        self.drawn = False

    def _moves_on(self, msg: str) -> bool:
        """Whether pytest's write `msg` (its writer has already counted it into its current
        line) takes the cursor off the row it was on when the status was drawn."""
        if "\n" in msg or "\r" in msg:
            return True
        return self._line_width() // self._cols != self._width // self._cols


class _Tee:
    """Stands in for pytest's terminal file while the status is shown: passes every write
    through, erasing the status before a write that would reach it and drawing it after."""

    def __init__(self, line: StatusLine, file: Any) -> None:
        self._line = line
        self._file = file

    def write(self, msg: str) -> int:
        line = self._line
        if not (line.drawn and line._moves_on(msg)):
            return self._file.write(msg)
        line._erase()
        n = self._file.write(msg)
        line._draw()
        return n

    def __getattr__(self, name: str) -> Any:  # flush, isatty, encoding, fileno, ...
        return getattr(self._file, name)
