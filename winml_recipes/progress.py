"""Progress display: a rich live view on a TTY, silence otherwise."""

from __future__ import annotations

import sys
from typing import Any

from winml_recipes.engine.plan import PlannedStep
from winml_recipes.engine.run import Reporter


class _Quiet(Reporter):
    def message(self, text: str) -> None:
        print(text, file=sys.stderr)

    def __enter__(self) -> _Quiet:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


class _Rich(Reporter):
    def __init__(self) -> None:
        from rich.console import Console
        from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        self.console = Console(stderr=True)
        self.progress = Progress(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            TimeElapsedColumn(),
            console=self.console,
            transient=False,
        )
        self.task: Any = None

    def __enter__(self) -> _Rich:
        self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.stop()

    def step_started(self, component: str, step: PlannedStep) -> None:
        from rich.markup import escape

        self.task = self.progress.add_task(escape(f"{component}: {step.name}"), total=1)

    def step_finished(self, component: str, step: PlannedStep, record: dict[str, Any]) -> None:
        from rich.markup import escape

        status = record["status"]
        extra = f" ({record['reason']})" if status == "skipped" else ""
        text = escape(f"{component}: {step.name} [{status}]{extra}")
        self.progress.update(self.task, completed=1, description=text)

    def message(self, text: str) -> None:
        self.console.print(text)


def make_reporter(enabled: bool) -> Reporter:
    return _Rich() if enabled else _Quiet()
