"""Progress: a rich live view on a TTY; plain lines otherwise (CI logs, pipes).

Passes report counts (calibration samples, verification samples) through
`StepContext.progress`; both reporters show them with an ETA. Without a terminal every
step prints one line when it ends (name, ran/cached/skipped, seconds; a matrix prefixes
the recipe and target); a step still running after LOG_AFTER_SECONDS logs its counts, then
every LOG_EVERY_SECONDS.
"""

from __future__ import annotations

import sys
import time
from typing import Any

from winml_recipes.engine.plan import PlannedStep
from winml_recipes.engine.run import Reporter
from winml_recipes.sdk.records import StepRecord

LOG_AFTER_SECONDS = 10.0
LOG_EVERY_SECONDS = 30.0


def _eta(started: float, done: int, total: int | None) -> str:
    if not total or done <= 0 or done >= total:
        return ""
    remaining = (time.monotonic() - started) / done * (total - done)
    return f", about {remaining:.0f} s left"


class _Lines(Reporter):
    """Plain lines, one per step and more for long ones (no terminal: CI logs, pipes)."""

    def __init__(self, stream=None, prefix: str = "") -> None:
        self.stream = stream or sys.stderr
        self.prefix = f"{prefix} " if prefix else ""
        self.started = 0.0
        self.last_line = 0.0
        self.logged = False
        self.counts: dict[str, Any] = {}
        self.last_count_end = 0.0

    def __enter__(self) -> _Lines:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def _print(self, text: str) -> None:
        print(f"{self.prefix}{text}", file=self.stream, flush=True)
        self.last_line = time.monotonic()
        self.logged = True

    def step_started(self, component: str, step: PlannedStep) -> None:
        self.started = self.last_line = time.monotonic()
        self.logged = False
        self.counts = {}
        self.last_count_end = 0.0

    def step_progress(
        self, component: str, step: PlannedStep, what: str, done: int, total: int | None
    ) -> None:
        # counting starts with the step (or when an earlier count of this step finished)
        key = self.counts.setdefault(what, self.last_count_end or self.started)
        if total and done >= total:
            self.last_count_end = time.monotonic()
        now = time.monotonic()
        due = (not self.logged and now - self.started >= LOG_AFTER_SECONDS) or (
            self.logged and now - self.last_line >= LOG_EVERY_SECONDS
        )
        if due:
            of = f"/{total}" if total else ""
            self._print(
                f"{component}: {step.name}: {what} {done}{of} ({now - self.started:.0f} s"
                f"{_eta(key, done, total)})"
            )

    def step_finished(self, component: str, step: PlannedStep, record: StepRecord) -> None:
        peak = record.peak_rss_mb
        long = self.logged or time.monotonic() - self.started >= LOG_AFTER_SECONDS
        memory = f", peak {peak / 1024:.1f} GB" if peak and long else ""
        self._print(
            f"{component}: {step.name} [{record.status}] "
            f"in {time.monotonic() - self.started:.1f} s{memory}"
        )

    def message(self, text: str) -> None:
        """Notices (waiting for another build's lock) go to stderr, beside errors."""
        print(f"{self.prefix}{text}", file=sys.stderr, flush=True)


MIN_NAME = 8  # a component name is shortened to no fewer characters (then the rest is)
BAR_WIDTH = 10


def fit_label(name: str, rest: str, width: int) -> str:
    """`name + rest` in `width` columns: the name is shortened first (to MIN_NAME), then the
    rest is cut; both with an ellipsis."""
    if len(name) + len(rest) <= width:
        return name + rest
    keep = max(width - len(rest), MIN_NAME)
    if keep < len(name):
        name = name[: keep - 1] + "…"
    text = name + rest
    return text if len(text) <= width else text[: max(width - 1, 0)] + "…"


class _Label:
    """A rich renderable: a step's label fitted to the width its table cell gets."""

    def __init__(self, name: str, rest: str) -> None:
        self.name, self.rest = name, rest

    def __rich_measure__(self, console: Any, options: Any) -> Any:
        from rich.measure import Measurement

        full = len(self.name) + len(self.rest)
        return Measurement(min(full, MIN_NAME + 1), full)

    def __rich_console__(self, console: Any, options: Any) -> Any:
        from rich.text import Text

        yield Text(fit_label(self.name, self.rest, options.max_width), no_wrap=True)


class _Rich(Reporter):
    """The live view. Its label column takes what the fixed columns leave (at 80 columns the
    counts, elapsed time and ETA stay whole; the component name is shortened first)."""

    def __init__(self, console: Any = None) -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            ProgressColumn,
            SpinnerColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )
        from rich.table import Column

        class LabelColumn(ProgressColumn):
            def render(self, task: Any) -> _Label:
                return _Label(task.fields.get("name", ""), task.fields.get("rest", ""))

        def fixed() -> Column:
            return Column(no_wrap=True, justify="right")

        self.console = console or Console(stderr=True)
        self.progress = Progress(
            SpinnerColumn(),
            LabelColumn(table_column=Column(ratio=1, no_wrap=True)),
            BarColumn(bar_width=BAR_WIDTH),
            MofNCompleteColumn(table_column=fixed()),
            TimeElapsedColumn(table_column=fixed()),
            TimeRemainingColumn(table_column=fixed()),
            console=self.console,
            transient=False,
            expand=True,
        )
        self.task: Any = None
        self.rest = ""

    def __enter__(self) -> _Rich:
        self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.stop()

    def step_started(self, component: str, step: PlannedStep) -> None:
        self.rest = f": {step.name}"
        self.task = self.progress.add_task("", total=None, name=component, rest=self.rest)

    def _live(self) -> Any:
        """The step's rich task, its clock running again: rich stops a task's elapsed time
        the first time a count completes, and a step counts several things in turn (verify:
        reference samples, then samples on the target), so the shown time would stay at the
        first count's end."""
        task = next((t for t in self.progress.tasks if t.id == self.task), None)
        if task is not None:
            task.finished_time = None
        return task

    def step_progress(
        self, component: str, step: PlannedStep, what: str, done: int, total: int | None
    ) -> None:
        self._live()
        self.progress.update(self.task, completed=done, total=total, rest=f"{self.rest} {what}")

    def step_finished(self, component: str, step: PlannedStep, record: StepRecord) -> None:
        status = record.status
        extra = f" ({record.reason})" if status == "skipped" else ""
        task = self._live()
        total = task.total if task is not None and task.total else 1
        rest = f": {step.name} [{status}]{extra}"
        self.progress.update(self.task, completed=total, total=total, rest=rest)
        if task is not None:  # the whole step's time, as the manifest records it
            task.finished_time = record.wall_seconds

    def message(self, text: str) -> None:
        self.console.print(text)


def make_reporter(enabled: bool, stream=None) -> Reporter:
    """The live view on a terminal (`enabled`), else one line per step on `stream`."""
    return _Rich() if enabled else _Lines(stream)


def step_lines(stream=None, prefix: str = "") -> Reporter:
    """One line per step on `stream`, each starting with `prefix` (a matrix's target)."""
    return _Lines(stream, prefix)
