"""What the long commands (``ab``, ``floor``, ``gate``, ``demo``) print while they work, and repeated warnings once.

:class:`Progress` counts the requests or pairs of one stage on stderr:

- on a terminal, one line rewritten in place (a bar, done of total, elapsed, ETA, what is running now), refreshed
  every second so that a request of minutes still shows the clock moving;
- otherwise (a pipe, a log file, CI), one plain line per finished request or pair, flushed at once, e.g.
  ``ab: 5/39 requests, quality/fewer-steps/demo-00-s1 (1.2 s); elapsed 0:12, ETA 0:40``.

The ETA is the time an item takes times the items left: from the second finished item on, the mean time between the
finishes after the first (the first item pays the model load and warm-up: 2 min at full size, and 2 min of the demo's
first request on a loaded 2-core VM), before that the first item's time. Items already on disk when the stage started
(a resumed run's) are counted done and left out.

:func:`quiet_repeats` (installed by the CLI around every command) shows each library warning once: a log record of
WARNING or above with the same logger, level and text as one already shown, or a Python warning with the same
category and text, is counted instead of printed, and the counts are printed when the command ends. (diffusers' LoRA
loader warned 13 times in one ``h3eval ab`` of issue 51; the suite's own warnings are filtered alike.)
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import sys
import threading
import time
import warnings
from typing import Any, Iterator, TextIO

_active: "Progress | None" = None
"""The terminal line shown now, cleared before a warning is printed over it."""
_stage: list[str] = []


@contextlib.contextmanager
def stage(prefix: str) -> Iterator[None]:
    """Prefix the label of every :class:`Progress` started inside (``demo 2/4`` + ``gates``)."""
    _stage.append(prefix)
    try:
        yield
    finally:
        _stage.pop()


def clock_text(seconds: float | None) -> str:
    """``m:ss`` (``h:mm:ss`` from an hour), ``?`` when unknown."""
    if seconds is None or not seconds == seconds or seconds < 0:
        return "?"
    whole = int(round(seconds))
    hours, rest = divmod(whole, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"


class Progress:
    """Progress of one stage of ``total`` items (requests, clips, pairs); see the module docstring."""

    def __init__(self, label: str, total: int, *, unit: str = "request", done: int = 0, enabled: bool = True,
                 stream: TextIO | None = None, tty: bool | None = None, clock=time.monotonic,
                 refresh_s: float = 1.0):
        self.label = " ".join([*_stage, label])
        self.total, self.unit, self.done, self.resumed = int(total), unit, int(done), int(done)
        self.stream = stream if stream is not None else sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)()) if tty is None else tty
        self.enabled = enabled
        self.clock = clock
        self.started = clock()
        self.current = ""
        self._lock = threading.RLock()
        self._closed = False
        self._first: float | None = None  # clock at the first item this process finished
        self._last: float | None = None  # and at the last
        self._timer: threading.Thread | None = None
        self._stop = threading.Event()
        if not self.enabled:
            return
        if self.tty:
            global _active
            _active = self
            self._draw()
            if refresh_s > 0:
                self._timer = threading.Thread(target=self._tick, args=(refresh_s,), daemon=True,
                                               name="progress")
                self._timer.start()
        else:
            left = self.total - self.done
            resumed = f" ({self.done} already done)" if self.done else ""
            self._write(f"{self.label}: {left} {self._units(left)} to go{resumed}\n")

    # -- counting -------------------------------------------------------------------------------------------------
    def eta_s(self) -> float | None:
        """Seconds left: an item's time (see the module docstring) times the items left (None before the first)."""
        timed = self.done - self.resumed
        if timed <= 0 or self._first is None or self._last is None:
            return None
        each = (self._last - self._first) / (timed - 1) if timed >= 2 else self._first - self.started
        return each * max(0, self.total - self.done)

    def now(self, what: str) -> None:
        """What is running now (shown on the terminal line)."""
        with self._lock:
            self.current = what
            if self.enabled and self.tty:
                self._draw()

    def advance(self, what: str = "", note: str = "", n: int = 1) -> None:
        """``n`` items finished: the last of them ``what`` (``note``: how it went, e.g. its seconds)."""
        with self._lock:
            self.done += n
            self._last = self.clock()
            if self._first is None:
                self._first = self._last
            if not self.enabled or self._closed:
                return
            if self.tty:
                self._draw()
                return
            item = f", {what}" + (f" ({note})" if note else "") if what else ""
            self._write(f"{self.label}: {self.done}/{self.total} {self._units(self.total)}{item}; elapsed "
                        f"{clock_text(self.clock() - self.started)}, ETA {clock_text(self.eta_s())}\n")

    def close(self) -> None:
        global _active
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._stop.set()
            if not self.enabled:
                return
            if self.tty:
                self.current = ""
                self._draw()
                self._write("\n")
                if _active is self:
                    _active = None
            else:
                self._write(f"{self.label}: {self.done}/{self.total} {self._units(self.total)} in "
                            f"{clock_text(self.clock() - self.started)}\n")

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- the terminal line -----------------------------------------------------------------------------------------
    def line(self, width: int = 120) -> str:
        """The terminal line: label, bar, done/total, elapsed, ETA and what runs now, cut to ``width``."""
        share = self.done / self.total if self.total else 1.0
        bar = "#" * int(round(20 * share))
        text = (f"{self.label} [{bar:<20}] {self.done}/{self.total} {self._units(self.total)} "
                f"elapsed {clock_text(self.clock() - self.started)} ETA {clock_text(self.eta_s())}")
        if self.current:
            text += f"  {self.current}"
        return text[: max(10, width - 1)]

    def clear(self) -> None:
        """Blank the terminal line (before something else is printed); the next refresh draws it again."""
        with self._lock:
            if self.enabled and self.tty and not self._closed:
                self._write("\r\x1b[K")

    def _draw(self) -> None:
        width = shutil.get_terminal_size((120, 24)).columns
        self._write("\r" + self.line(width) + "\x1b[K")

    def _tick(self, every: float) -> None:
        while not self._stop.wait(every):
            with self._lock:
                if not self._closed:
                    self._draw()

    def _units(self, count: int) -> str:
        return self.unit if count == 1 else self.unit + "s"

    def _write(self, text: str) -> None:
        try:
            self.stream.write(text)
            self.stream.flush()
        except (OSError, ValueError):  # a closed pipe: progress is never worth failing the run
            pass


class PairSteps:
    """The calls of ``rich.progress.Progress`` that the gate runner makes (``add_task``, ``advance``, ``update``),
    over a :class:`Progress` of ``pairs`` pairs: ``update(task, pair=NAME, steps=N)`` starts a pair of N gate results
    (computed or resumed), each ``advance`` is one of them, and the pair's last one finishes it. A pair none of whose
    gates ran (no ``update(task, description=...)``: every result was kept from an earlier run) reads "resumed"."""

    def __init__(self, label: str, pairs: int, enabled: bool = True, **kwargs: Any):
        self.progress = Progress(label, pairs, unit="pair", enabled=enabled, **kwargs)
        self.pair, self.left, self.pair_started, self.ran = "", 0, time.monotonic(), False

    def add_task(self, description: str = "", total: int = 0, **_: Any) -> int:
        return 0

    def update(self, task: int, description: str | None = None, pair: str | None = None, steps: int | None = None,
               **_: Any) -> None:
        if pair is not None:
            if self.left > 0:  # the previous pair gave fewer results than it said: it is over all the same
                self._finish()
            self.pair, self.left, self.pair_started, self.ran = pair, int(steps or 0), time.monotonic(), False
            self.progress.now(pair)
            if self.left <= 0:
                self._finish()
        elif description is not None:
            self.ran = True
            self.progress.now(description)

    def advance(self, task: int, advance: int = 1) -> None:
        if self.left > 0:
            self.left -= advance
            if self.left <= 0:
                self._finish()

    def _finish(self) -> None:
        self.left = 0
        self.progress.advance(self.pair, f"{time.monotonic() - self.pair_started:.1f} s" if self.ran else "resumed")

    def __enter__(self) -> "PairSteps":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.progress.close()


# -- repeated warnings, once ----------------------------------------------------------------------------------------
class Repeats:
    """Counts of the warnings shown once; :meth:`shown` says whether one is new (and counts it when not)."""

    def __init__(self) -> None:
        self.seen: dict[tuple, list] = {}
        self.lock = threading.Lock()

    def shown(self, key: tuple, text: str) -> bool:
        with self.lock:
            entry = self.seen.get(key)
            if entry is None:
                self.seen[key] = [text, 0]
                return True
            entry[1] += 1
            return False

    def summary(self) -> list[str]:
        """One line per warning that repeated: how many more times, and its text (cut to one line)."""
        with self.lock:
            out = []
            for text, more in self.seen.values():
                if more:
                    first = text.strip().splitlines()[0] if text.strip() else text
                    first = first if len(first) <= 100 else first[:97] + "..."
                    out.append(f"  {more} more time{'s' if more != 1 else ''}: {first}")
            return out


REPEATS = Repeats()


class RepeatFilter(logging.Filter):
    """Lets a WARNING-or-above record through the first time its (logger, level, text) is seen; counts the rest.
    Lower levels (``--verbose``) all pass."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return True
        message = record.getMessage()
        if not REPEATS.shown(("log", record.name, record.levelno, message), f"{record.levelname} {record.name}: "
                                                                             f"{message}"):
            return False
        if _active is not None:
            _active.clear()
        return True


_FILTER = RepeatFilter()
_installed: list = []


def quiet_repeats():
    """Show each warning once until the returned function is called (the CLI calls it when the command ends): the
    filter on every logger there is and on every one made meanwhile (diffusers and transformers make theirs when
    first imported), and around :func:`warnings.showwarning`. The returned function prints the counts of those that
    repeated on stderr and takes it all away again (so a test process that runs the CLI in-process keeps its own
    logging as it was). A second call while installed changes nothing and returns a function that does nothing."""
    global REPEATS
    if _installed:
        return lambda: None
    REPEATS = Repeats()
    loggers = [logging.getLogger()] + [lg for lg in list(logging.Logger.manager.loggerDict.values())
                                       if isinstance(lg, logging.Logger)]
    for logger in loggers:
        logger.addFilter(_FILTER)
    base = logging.getLoggerClass()

    class FilteredLogger(base):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.addFilter(_FILTER)

    logging.setLoggerClass(FilteredLogger)
    show = warnings.showwarning

    def showwarning(message, category, filename, lineno, file=None, line=None):  # noqa: ANN001 - the stdlib's
        if REPEATS.shown(("warning", category, str(message)), f"{category.__name__}: {message}"):
            if _active is not None:
                _active.clear()
            show(message, category, filename, lineno, file, line)

    warnings.showwarning = showwarning
    _installed.append(True)

    def restore() -> None:
        print_repeats()
        if warnings.showwarning is showwarning:
            warnings.showwarning = show
        if logging.getLoggerClass() is FilteredLogger:
            logging.setLoggerClass(base)
        for logger in [logging.getLogger()] + list(logging.Logger.manager.loggerDict.values()):
            if isinstance(logger, logging.Logger):
                logger.removeFilter(_FILTER)
        _installed.clear()

    return restore


def print_repeats(stream: TextIO | None = None) -> None:
    """The warnings shown once that repeated, with their counts (nothing when none did)."""
    lines = REPEATS.summary()
    if not lines:
        return
    stream = stream if stream is not None else sys.stderr
    try:
        stream.write("warnings shown once above that repeated:\n" + "\n".join(lines) + "\n")
        stream.flush()
    except (OSError, ValueError):
        pass
