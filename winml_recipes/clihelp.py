"""Click options whose help text is computed when `--help` shows it.

Help built from the plugin registries (the tasks the task metrics judge) would load every
plugin at each CLI start; computed here, only `--help` pays for it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click


class LazyHelpOption(click.Option):
    """A click option whose `help` comes from `help_from()` when the help is shown."""

    def __init__(self, *args: Any, help_from: Callable[[], str], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.help_from = help_from

    def get_help_record(self, ctx: click.Context) -> tuple[str, str] | None:
        self.help = self.help_from()
        return super().get_help_record(ctx)
