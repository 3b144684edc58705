"""`--executor NAME [--jobs N] [--address A]` -> an executor, options checked."""

from __future__ import annotations

from winml_recipes.exec.executors import Executor, LocalExecutor, PoolExecutor


def make_executor(name: str, *, jobs: int | None = None, address: str | None = None) -> Executor:
    """The executor for `--executor NAME` (`--jobs` processes or Ray CPUs; `--address`)."""
    import os

    from winml_recipes.sdk.errors import RecipeError

    if address is not None and name != "ray":
        raise RecipeError("--address is for --executor ray")
    if name == "local":
        if jobs not in (None, 1):
            raise RecipeError("--jobs needs --executor pool or ray (local builds one at a time)")
        return LocalExecutor()
    if jobs is not None and jobs < 1:
        raise RecipeError(f"--jobs {jobs}: at least 1")
    if name == "pool":
        return PoolExecutor(jobs or os.cpu_count() or 1)
    if name == "ray":
        from winml_recipes.exec.ray_executor import RayExecutor

        return RayExecutor(address=address, jobs=jobs)
    raise RecipeError(f"unknown executor '{name}'; known: local, pool, ray")
