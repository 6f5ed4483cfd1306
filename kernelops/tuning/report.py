"""What ``kernelops tune`` shows: a progress line on stderr and the summary table."""

from __future__ import annotations

import shutil
import sys
from typing import TextIO

from kernelops.tuning.runner import Outcome, RunReport


class ProgressLine:
    """Progress on ``stream`` (stderr): on a terminal one bar redrawn in place, with the current
    key and its tuning step; elsewhere (a log file) one line per finished key. ``quiet``: nothing."""

    width = 24

    def __init__(self, op_name: str, total: int, *, quiet: bool = False, stream: TextIO | None = None,
                 tty: bool | None = None):
        self.op_name, self.total, self.quiet = op_name, total, quiet
        self.stream = stream if stream is not None else sys.stderr
        self.tty = self.stream.isatty() if tty is None else tty
        self.index, self.label = 0, ""

    def _bar(self, done: int, total: int) -> str:
        filled = int(self.width * done / max(total, 1))
        return f"[{'#' * filled}{'.' * (self.width - filled)}] {done}/{total}"

    def _draw(self, text: str) -> None:
        width = shutil.get_terminal_size((120, 24)).columns - 1  # one line, redrawn in place
        self.stream.write(f"\r{text[:width]:<{width}}")
        self.stream.flush()

    def phase(self, text: str, done: int, total: int) -> None:
        """A step of work before tuning (e.g. compile warm-up)."""
        if not self.quiet and self.tty:
            self._draw(f"kernelops tune {self.op_name} {text} {self._bar(done, total)}")

    def start(self, index: int, spec) -> None:
        self.index, self.label = index, spec.summary()
        self.step(0, 0, "")

    def step(self, done: int, total: int, note: str) -> None:
        """The autotuner's progress callback within the current key."""
        if not self.quiet and self.tty:
            inner = f"{done}/{total} {note}" if total else "preparing"
            self._draw(f"kernelops tune {self.op_name} {self._bar(self.index, self.total)} {self.label}: {inner}")

    def finish(self, rows: list[Outcome]) -> None:
        if self.quiet:
            return
        if self.tty:
            self._draw(f"kernelops tune {self.op_name} {self._bar(self.index + 1, self.total)} {self.label}")
        else:
            row = rows[0]
            status = row.error or f"{_ms(row.heuristic_ms)} -> {_ms(row.ms)} ms ({_speedup(row)})"
            self.stream.write(f"[{self.index + 1}/{self.total}] {self.label}: {status} in {row.seconds:.1f}s\n")
            self.stream.flush()

    def close(self) -> None:
        if not self.quiet and self.tty:
            self.stream.write("\n")
            self.stream.flush()


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _speedup(row: Outcome) -> str:
    return "-" if row.speedup is None else f"{row.speedup:.2f}x"


def summary_table(report: RunReport) -> str:
    """One row per key: key summary, heuristic ms, tuned ms, speed-up, seconds, where written."""
    header = ("key", "heuristic ms", "tuned ms", "speed-up", "seconds", "written")
    rows = []
    for o in report.outcomes:
        if o.error is not None:
            rows.append((o.spec.summary(o.train), "-", "-", "-", f"{o.seconds:.1f}", f"FAILED: {o.error}"))
            continue
        seconds = "derived" if o.derived_from else f"{o.seconds:.1f}"
        rows.append((o.spec.summary(o.train), _ms(o.heuristic_ms), _ms(o.ms), _speedup(o), seconds, o.written))
    widths = [max(len(r[i]) for r in [header] + rows) for i in range(len(header) - 1)]
    lines = []
    for r in [header] + rows:
        cells = [r[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(r[1:-1], widths[1:])]
        lines.append("  ".join(cells + [r[-1]]))
    return "\n".join(lines)


def totals_line(report: RunReport) -> str:
    tuned = [o for o in report.outcomes if o.error is None and not o.derived_from]
    derived = [o for o in report.outcomes if o.derived_from]
    text = (f"tuned {len(tuned)} key(s) and derived {len(derived)} in {sum(o.seconds for o in report.outcomes):.0f}s"
            f"; {len(report.failed)} failed")
    if report.stopped:
        text += f"; stopped ({report.stopped}) with {report.left} spec(s) left"
    return text
