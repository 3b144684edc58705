"""Matrix bench: the same recipes x targets built by `local`, `pool` and `ray`, each from an
empty cache of its own, in one run; wall times as ratios against local, Ray's start-up
measured apart (ray.init to a cluster that runs tasks), and the outputs checked identical.

Default: sam3-tiny's 5 targets + 3 targets of a small MLP recipe (8 builds).
`--reduced`: 2 MLP recipes x 3 targets (6 builds of about a second each: the executors'
own overhead dominates).

    python bench/matrix.py [--reduced] [--jobs 2]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

MLP_TARGETS = (
    "targets:\n  - {device: cpu, precision: fp32}\n  - {device: cpu, precision: int8}\n"
    "  - {device: npu, precision: uint8}\n"
)


def _mlp_recipes(root: Path, count: int) -> list[Path]:
    from tests.conftest import MLP_CATALOG, make_mlp_onnx

    (root / "catalog").mkdir(parents=True)
    (root / "recipes").mkdir()
    out = []
    for i in range(count):
        make_mlp_onnx(root / "catalog" / f"mlp{i}.onnx", seed=i, hidden=64)
        text = MLP_CATALOG.format(ref=f"./mlp{i}.onnx").replace("name: mlp", f"name: mlp{i}")
        (root / "catalog" / f"mlp{i}.yaml").write_text(text)
        recipe = root / "recipes" / f"mlp{i}.yaml"
        recipe.write_text(f"schema_version: 1\nname: mlp{i}\nmodel: mlp{i}\n{MLP_TARGETS}")
        out.append(recipe)
    return out


def _ray_startup(jobs: int) -> float:
    import ray

    started = time.perf_counter()
    ray.init(num_cpus=jobs, include_dashboard=False, log_to_driver=False)
    ray.get(ray.remote(lambda: 1).remote())  # a worker that runs a task
    return time.perf_counter() - started


def run(reduced: bool, jobs: int) -> dict:
    from winml_recipes import api
    from winml_recipes.exec.reproducible import fingerprint

    with tempfile.TemporaryDirectory(prefix="winml-bench-matrix-") as tmp:
        root = Path(tmp)
        recipes: list[Path] = _mlp_recipes(root, 2 if reduced else 1)
        if not reduced:
            recipes.insert(0, REPO / "recipes" / "sam3-tiny.yaml")
        walls, reports = {}, {}
        startup = None
        for executor in ("local", "pool", "ray"):
            if executor == "ray":
                startup = _ray_startup(jobs)  # the cluster is then reused by the matrix
            started = time.perf_counter()
            report = api.matrix(
                recipes,
                executor=executor,
                jobs=None if executor == "local" else jobs,
                output_root=root / executor,
                cache_dir=root / f"cache-{executor}",
            )
            walls[executor] = time.perf_counter() - started
            reports[executor] = report
            assert report.exit_code == 0, [o.error for o in report.outcomes if o.error]
        import ray

        ray.shutdown()
        identical = all(
            fingerprint(Path(o.output_dir))
            == fingerprint(root / ex / Path(o.output_dir).relative_to(root / "local"))
            for o in reports["local"].outcomes
            for ex in ("pool", "ray")
        )
        tasks = reports["local"].tasks
        return {
            "targets": len(reports["local"].outcomes),
            "tasks": len(tasks),
            "tasks_shared_by_targets": sum(len(t["targets"]) > 1 for t in tasks),
            "jobs": jobs,
            "local_s": round(walls["local"], 2),
            "pool_s": round(walls["pool"], 2),
            "ray_s": round(walls["ray"], 2),
            "pool_over_local": round(walls["pool"] / walls["local"], 3),
            "ray_over_local": round(walls["ray"] / walls["local"], 3),
            "ray_startup_s": round(startup or 0.0, 2),
            "identical_outputs": identical,
        }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reduced", action="store_true")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    args = parser.parse_args(argv)
    r = run(args.reduced, args.jobs)
    print(f"matrix of {r['targets']} target builds, {r['jobs']} workers (empty caches each)")
    print(f"{r['tasks']} tasks, {r['tasks_shared_by_targets']} of them shared by several targets")
    print(f"local                       {r['local_s']:8.2f} s")
    print(f"pool                        {r['pool_s']:8.2f} s   ratio {r['pool_over_local']:.3f}")
    print(f"ray (cluster already up)    {r['ray_s']:8.2f} s   ratio {r['ray_over_local']:.3f}")
    print(f"ray start-up (apart)        {r['ray_startup_s']:8.2f} s")
    print(f"outputs identical across executors: {r['identical_outputs']}")
    out = REPO / "bench" / "out"
    out.mkdir(exist_ok=True)
    (out / "matrix.json").write_text(json.dumps(r, indent=2) + "\n")
    return 0 if r["identical_outputs"] else 1


if __name__ == "__main__":
    sys.exit(main())
