"""`cache info/prune/verify`: inspect and trim the step cache."""

from __future__ import annotations

import click

from winml_recipes.cli.app import _echo_json, main
from winml_recipes.untrusted import printable


@main.group()
def cache() -> None:
    """Inspect and trim the step cache ($WINML_RECIPES_CACHE or the platform's cache folder)."""


@cache.command("info")
@click.option("--json", "as_json", is_flag=True)
def cache_info(as_json) -> None:
    """Where the cache is, its entries and stored upstream outputs, and their sizes."""
    from winml_recipes.engine.cache import StepCache

    stats = StepCache().stats()
    if as_json:
        _echo_json(stats)
        return
    click.echo(
        f"{stats['root']}: {stats['entries']} step results ({stats['entry_bytes'] / 1e9:.2f} GB),"
        f" {stats['stored_outputs']} stored upstream outputs "
        f"({stats['stored_output_bytes'] / 1e9:.2f} GB)"
    )


@cache.command("prune")
@click.option("--max-size", required=True, metavar="SIZE", help="e.g. 20GB or 500MB.")
def cache_prune(max_size) -> None:
    """Delete the least recently used results until the cache fits in SIZE (run it while no
    build uses the cache)."""
    from winml_recipes.engine.budget import parse_budget
    from winml_recipes.engine.cache import StepCache

    mb = parse_budget(max_size, where="--max-size", minimum_mb=0)
    done = StepCache().prune(int(mb * 1024 * 1024))
    click.echo(
        f"removed {done['removed']} items ({done['freed_bytes'] / 1e9:.2f} GB); "
        f"{done['remaining_bytes'] / 1e9:.2f} GB left"
    )


@cache.command("verify")
def cache_verify() -> None:
    """Hash every entry against its record; damaged entries are deleted (a build then
    recomputes them; reads already refuse them)."""
    from winml_recipes.engine.cache import StepCache

    done = StepCache().verify()
    click.echo(f"{done['intact']} entries intact, {done['removed']} damaged entries removed")
    if done["foreign"]:
        shown = ", ".join(printable(p) for p in done["foreign"][:3])
        more = f" and {len(done['foreign']) - 3} more" if len(done["foreign"]) > 3 else ""
        click.echo(
            f"warning: {len(done['foreign'])} items in the cache folder were not made by the "
            f"cache ({shown}{more}); left in place, move them out",
            err=True,
        )
