"""The tasks of a matrix and their edges, planned in the driver.

Each target's plan is cut into tasks:

- a *steps* task runs a stretch of one component's step chain. Steps that every target
  computes alike are one task: a step is identified by its *plan key*, a hash of what the
  cache key will hold, known before anything runs (the source's digest, then per step the
  pass, its options, the target when the pass depends on it, and the plan keys of the
  components it reads through `inputs_from`). Two targets whose steps have the same plan
  keys share those tasks (sam3-tiny's export is one task for all its targets). A stretch
  ends where targets part ways, and a step that reads another component starts a new one,
  with an edge from that component's last task (the decoder's calibration waits for the
  encoder's float model; its export does not).
- a component's steps up to its last fail-fast step (`preflight`: opened on the target
  before any calibration; `ComponentPlan.checked_first`) end a task, and the first task
  after them, in every component of the target, waits for the other components' such
  tasks: a graph the target cannot take fails the build before any calibration starts.
- an *assemble* task per target ships its components' final models into the output folder
  with the manifest, once its last steps tasks are done.

Tasks hand each other only plain data: the chain's state (paths into the shared step
cache, with digests) and the steps' manifest records. The scheduling state lives here too,
so every executor runs the same graph: it asks for `ready()` tasks, runs `call(task)`
wherever it likes, and hands each result to `finish`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from winml_recipes.engine.plan import Plan
from winml_recipes.exec.keys import plan_fingerprint, plan_keys
from winml_recipes.exec.task import FAILED, NOT_RUN, OK, TargetOutcome, TargetTask, not_run
from winml_recipes.exec.work import AssembleTask, StepsTask, TaskResult, assemble, run_steps_task
from winml_recipes.sdk.records import StepRecord

WAITING, RUNNING = "waiting", "running"
STOPPED = "not started: an earlier target failed (--keep-going builds every target)"


@dataclass
class Node:
    """One task of the graph."""

    id: str
    kind: str  # "steps" or "assemble"
    label: str
    targets: list[int]  # the target tasks that need it (indices)
    component: str | None = None
    steps: tuple[int, ...] = ()  # step indices within the component's chain
    after: str | None = None  # the steps task whose final state this one starts from
    # component -> its last task (None: it has no steps, its source is what it gives)
    upstream: dict[str, str | None] = field(default_factory=dict)
    chains: dict[str, list[str]] = field(default_factory=dict)  # assemble: comp -> tasks
    # the tasks ending other components' fail-fast checks, which this one waits for
    checks: list[str] = field(default_factory=list)
    memory_mb: float = 0.0
    status: str = WAITING
    result: TaskResult | None = None
    attempts: int = 0

    @property
    def needs(self) -> list[str]:
        deps = [self.after] if self.after else []
        deps += [n for n in self.upstream.values() if n is not None]
        deps += [n for n in self.checks if n not in deps]
        deps += [n for chain in self.chains.values() for n in chain[-1:]]
        return deps

    def to_dict(self, offset: int = 0) -> dict[str, Any]:
        r = self.result
        return {
            "id": self.id[:16],
            "kind": self.kind,
            "label": self.label,
            "component": self.component,
            "steps": list(self.steps),
            "targets": [i + offset for i in self.targets],
            "needs": [n[:16] for n in self.needs],
            "status": self.status,
            "attempts": self.attempts,
            "memory_mb": round(self.memory_mb),
            "worker_pid": r.worker_pid if r else None,
            "started_at": r.started_at if r else None,
            "finished_at": r.finished_at if r else None,
            "wall_seconds": r.wall_seconds if r else 0.0,
            "resources": r.resources if r else {},
        }


OnTarget = Callable[[int, TargetOutcome], None]


class TaskGraph:
    """The tasks of every target, their edges, and where each stands."""

    def __init__(
        self,
        tasks: list[TargetTask],
        plans: dict[int, Plan],
        *,
        keep_going: bool,
        on_target: OnTarget,
        memory: Callable[[int, Plan, str, tuple[int, ...]], float] | None = None,
        raise_errors: bool = False,
    ) -> None:
        self.tasks = tasks
        self.plans = plans
        self.keep_going = keep_going
        self.on_target = on_target
        self.raise_errors = raise_errors
        self.nodes: dict[str, Node] = {}
        self.outcomes: dict[int, TargetOutcome] = {}
        self.stopped = False
        keys = {index: plan_keys(plan) for index, plan in plans.items()}
        self.fingerprints = {index: plan_fingerprint(plan) for index, plan in plans.items()}
        self._users: dict[str, set[int]] = {}
        for index, per_comp in keys.items():
            for chain in per_comp.values():
                for key in chain:
                    self._users.setdefault(key, set()).add(index)
        for index, plan in plans.items():
            self._add_target(index, plan, keys[index], memory)

    # ------------------------------------------------------------------ building

    def _add_target(self, index: int, plan: Plan, keys: dict[str, list[str]], memory) -> None:
        chains: dict[str, list[str]] = {}
        checked: dict[str, str] = {}  # component -> the task ending its fail-fast checks
        first_after: dict[str, str] = {}  # component -> its first task after them
        for comp in plan.components:
            chain: list[str] = []
            early = comp.checked_first
            for span in self._stretches(comp.steps, keys[comp.name], early):
                node_id = keys[comp.name][span[-1]]
                node = self.nodes.get(node_id)
                if node is None:
                    first = comp.steps[span[0]]
                    deps = () if first.skip else first.impl.depends_on(first.config)
                    names = ", ".join(comp.steps[j].name for j in span)
                    node = self.nodes[node_id] = Node(
                        node_id,
                        "steps",
                        f"{plan.recipe.name} {comp.name} [{names}]",
                        [],
                        component=comp.name,
                        steps=span,
                        after=chain[-1] if chain else None,
                        upstream={d: (chains[d] or [None])[-1] for d in deps},
                    )
                node.targets.append(index)
                if memory is not None:
                    node.memory_mb = max(node.memory_mb, memory(index, plan, comp.name, span))
                if span[-1] == early - 1:
                    checked[comp.name] = node_id
                elif span[0] == early:
                    first_after[comp.name] = node_id
                chain.append(node_id)
            chains[comp.name] = chain
        # Every component's fail-fast checks before any component's later steps.
        for comp, node_id in first_after.items():
            node = self.nodes[node_id]
            node.checks += [c for o, c in checked.items() if o != comp and c not in node.checks]
        target = plan.target.label
        assemble_id = f"assemble:{index}"
        self.nodes[assemble_id] = Node(
            assemble_id,
            "assemble",
            f"{plan.recipe.name} {target}",
            [index],
            chains=chains,
            memory_mb=memory(index, plan, "", ()) if memory is not None else 0.0,
        )

    def _stretches(self, steps, keys: list[str], early: int = 0) -> list[tuple[int, ...]]:
        """A component's steps cut into tasks (step indices); the first `early` ones (its
        fail-fast checks and the steps before them) end a task."""
        out: list[tuple[int, ...]] = []
        start = 0
        for i in range(len(steps)):
            last = i + 1 == len(steps) or i + 1 == early
            if last or self._cut_before(steps[i + 1], keys[i : i + 2]):
                out.append(tuple(range(start, i + 1)))
                start = i + 1
        return out

    def _cut_before(self, step, pair: list[str]) -> bool:
        """A new task starts at `step` when fewer targets share it than the step before
        (the targets part ways there), or when it reads another component."""
        key, next_key = pair
        reads = not step.skip and bool(step.impl.depends_on(step.config))
        return reads or self._users[next_key] != self._users[key]

    # ------------------------------------------------------------------ scheduling

    def ready(self, limit: int | None = None) -> list[Node]:
        """Up to `limit` tasks whose inputs are all done, in the order they were planned
        (a target's tasks before the next target's); they are marked running."""
        if self.stopped:
            return []
        out: list[Node] = []
        for node in self.nodes.values():
            if limit is not None and len(out) >= limit:
                break
            if node.status == WAITING and all(self.nodes[n].status == OK for n in node.needs):
                node.status = RUNNING
                node.attempts += 1
                out.append(node)
        return out

    def call(self, node: Node) -> tuple[Callable[[Any], TaskResult], Any]:
        """The function and its (picklable) argument that run `node` anywhere."""
        spec = self.tasks[node.targets[0]]
        if node.kind == "assemble":
            chains = {
                comp: (
                    [r for n in ids for r in self._result(n).records],
                    self._result(ids[-1]).state if ids else None,
                )
                for comp, ids in node.chains.items()
            }
            started = [self._result(n).started_at for ids in node.chains.values() for n in ids]
            first = min((s for s in started if s is not None), default=time.time())
            fingerprint = self.fingerprints[node.targets[0]]
            return assemble, AssembleTask(spec, chains, first, fingerprint, self.raise_errors)
        assert node.component is not None
        state = self._result(node.after).state if node.after else None
        upstream = {c: self._result(n).state if n else None for c, n in node.upstream.items()}
        steps_task = StepsTask(
            spec,
            node.component,
            node.steps,
            state,
            upstream,
            self.fingerprints[node.targets[0]],
            self._targets_label(node),
            self.raise_errors,
        )
        return run_steps_task, steps_task

    def _targets_label(self, node: Node) -> str:
        """'sam3-tiny cpu/int8', or with every target a shared task builds for."""
        plans = [self.plans[i] for i in node.targets]
        names = ", ".join(p.target.label for p in plans)
        return f"{plans[0].recipe.name} {names}"

    def _result(self, node_id: str) -> TaskResult:
        result = self.nodes[node_id].result
        assert result is not None, node_id
        return result

    def finish(self, node: Node, result: TaskResult) -> None:
        """Record what a task gave; a failure fails every target that needs it."""
        node.result = result
        node.status = result.status
        if result.status == OK:
            if node.kind == "assemble":
                (index,) = node.targets
                outcome = result.outcome
                assert outcome is not None
                outcome = replace(outcome, **self._span(index, outcome))
                self._target_done(index, outcome)
            return
        if result.status == NOT_RUN:
            return
        for index in node.targets:
            if index in self.outcomes:
                continue
            task = self.tasks[index]
            plan = self.plans[index]
            error, evidence, metrics = self._keep_evidence(index, node, result)
            self._target_done(
                index,
                TargetOutcome(
                    task.recipe,
                    plan.target.device,
                    plan.target.precision,
                    FAILED,
                    ep=plan.target.ep or None,
                    exit_code=result.exit_code,
                    error=error,
                    evidence_dir=evidence,
                    metrics=metrics,
                    failing_step=result.failing_step,
                    error_data=result.error_data,
                    wall_seconds=result.wall_seconds,
                    name=plan.recipe.name,
                    worker_pid=result.worker_pid,
                    started_at=result.started_at,
                    finished_at=result.finished_at,
                    resources=result.resources,
                ),
            )
        self._drop_unreachable()
        if not self.keep_going:
            self.stop(STOPPED)

    def _keep_evidence(
        self, index: int, failed: Node, result: TaskResult
    ) -> tuple[str | None, str | None, dict[str, Any]]:
        """A target whose steps task failed keeps what it made so far in its `.failed`
        folder (each component's records and last model up to the failure): the error
        naming the folder, the folder (None: nothing ran, or it could not be kept) and
        the key metrics of what it made (the summary's size and lowest SQNR)."""
        import json
        from pathlib import Path

        from winml_recipes.exec.task import key_metrics
        from winml_recipes.exec.work import keep_failed_evidence

        if failed.kind != "steps":
            return result.error, None, {}
        chains: dict[str, tuple[list[dict[str, Any]], Any]] = {}
        for comp, ids in self.nodes[f"assemble:{index}"].chains.items():
            records: list[StepRecord] = []
            state = None
            for node_id in ids:
                node = self.nodes[node_id]
                if node.result is None or node.status not in (OK, FAILED):
                    break
                if node.status == FAILED and node_id != failed.id:
                    break
                records += node.result.records
                state = node.result.state or state
                if node.status == FAILED:
                    break
            chains[comp] = (records, state)
        starts = [n.result.started_at for n in self.nodes.values()
                  if index in n.targets and n.result and n.result.started_at]  # fmt: skip
        wall = time.time() - min(starts) if starts else 0.0
        try:
            folder = keep_failed_evidence(
                self.tasks[index], self.plans[index], chains, result.error or "", wall
            )
        except Exception as exc:  # the target's own error matters more
            return f"{result.error}; no evidence kept ({type(exc).__name__}: {exc})", None, {}
        if folder is None:
            return result.error, None, {}
        manifest = json.loads((Path(folder) / "manifest.json").read_text())
        return f"{result.error}; evidence kept in {folder}/", folder, key_metrics(manifest)

    def _span(self, index: int, outcome: TargetOutcome) -> dict[str, Any]:
        """A target's wall time: from its first task's start to its assembly's end; the
        resources: the most any of its tasks was granted."""
        mine = [n for n in self.nodes.values() if index in n.targets and n.result is not None]
        starts = [n.result.started_at for n in mine if n.result and n.result.started_at]
        ends = [n.result.finished_at for n in mine if n.result and n.result.finished_at]
        granted = [n.result.resources for n in mine if n.result and n.result.resources]
        out: dict[str, Any] = {}
        if starts and ends:
            out["started_at"], out["finished_at"] = min(starts), max(ends)
            out["wall_seconds"] = round(max(ends) - min(starts), 3)
        if granted:
            out["resources"] = max(granted, key=lambda r: r.get("memory", 0.0))
        return out

    def _drop_unreachable(self) -> None:
        """Tasks that wait for a failed one never run."""
        changed = True
        while changed:
            changed = False
            for node in self.nodes.values():
                if node.status == WAITING and any(
                    self.nodes[n].status in (FAILED, NOT_RUN) for n in node.needs
                ):
                    node.status = NOT_RUN
                    changed = True

    def stop(self, why: str) -> None:
        """No task starts any more; targets not done are reported as not run (`why`)."""
        self.stopped = True
        for node in self.nodes.values():
            if node.status == WAITING:
                node.status = NOT_RUN
        self._not_run(self.plans, why)

    def _not_run(self, indices, why: str) -> None:
        """Targets without an outcome and no task still running: not run (`why`)."""
        for index in indices:
            running = any(n.status == RUNNING and index in n.targets for n in self.nodes.values())
            if index not in self.outcomes and not running:
                self._target_done(index, not_run(self.tasks[index], why))

    def cancelled(self, node: Node, why: str) -> None:
        """A running task that was stopped (not failed): its targets are not run."""
        node.status = NOT_RUN
        self._not_run(node.targets, why)

    def _target_done(self, index: int, outcome: TargetOutcome) -> None:
        self.outcomes[index] = outcome
        self.on_target(index, outcome)

    def settle(self, why: str) -> None:
        """After the executor is done: every target without an outcome is not run."""
        for index in self.plans:
            if index not in self.outcomes:
                self._target_done(index, not_run(self.tasks[index], why))

    def summary(self, offset: int = 0) -> list[dict[str, Any]]:
        """Every task as the report lists it (`offset`: targets listed before these)."""
        return [n.to_dict(offset) for n in self.nodes.values()]
