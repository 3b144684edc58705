"""The matrix as a graph of tasks: what targets share is one task, a component that reads
another waits only for it, and the graph's outputs are those of plain builds."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import RECIPES, make_mlp_project
from winml_recipes import api
from winml_recipes.exec.graph import TaskGraph
from winml_recipes.exec.matrix import plan_targets
from winml_recipes.exec.reproducible import fingerprint
from winml_recipes.exec.task import TargetTask

SAM3 = str(RECIPES / "sam3-tiny.yaml")


def _graph(recipe: str, targets: list[tuple[str, ...]]) -> tuple[TaskGraph, list[str]]:
    tasks = [TargetTask(recipe, *t) for t in targets]
    plans, failed = plan_targets(tasks)
    assert not failed
    graph = TaskGraph(tasks, plans, keep_going=True, on_target=lambda i, o: None)
    return graph, [t.target for t in tasks]


def _targets(graph: TaskGraph, names: list[str], node) -> set[str]:
    return {names[i] for i in node.targets}


def test_sam3_tiny_targets_share_exports_and_npu_shape_fixing() -> None:
    targets = api.targets_of(SAM3)
    graph, names = _graph(SAM3, targets)
    steps = [n for n in graph.nodes.values() if n.kind == "steps"]
    first = {n.component: n for n in steps if n.after is None}
    # each component's export is one task, used by every target
    assert set(first) == {"vision_encoder", "prompt_encoder_mask_decoder"}
    for node in first.values():
        assert node.label.split("[")[1].startswith("export")
        assert _targets(graph, names, node) == set(names)
    # the npu targets fix shapes (and the encoder's prepare) alike: one task per component
    fixing = [n for n in steps if n.label.endswith(("[fix_shapes]", "[fix_shapes, prepare]"))]
    assert len(fixing) == 2
    npu = {"npu/w8a16", "npu/uint8", "npu/uint8/openvino"}  # whatever EP builds them
    assert all(_targets(graph, names, n) == npu for n in fixing)
    # every quantize is its target's own
    quantizing = [n for n in steps if "quantize" in n.label]
    assert len(quantizing) == 2 * sum(t[1] != "fp32" for t in targets)
    assert all(len(n.targets) == 1 for n in quantizing)


def test_the_decoder_calibration_waits_for_its_targets_encoder_and_not_its_export() -> None:
    graph, _ = _graph(SAM3, [("cpu", "int8"), ("cpu", "uint8")])
    nodes = graph.nodes
    for node in nodes.values():
        if node.component != "prompt_encoder_mask_decoder" or "quantize" not in node.label:
            continue
        (encoder,) = node.upstream.values()
        assert nodes[encoder].component == "vision_encoder"
        assert nodes[encoder].targets == node.targets  # the same target's encoder
        # the encoder's last task, not an earlier one
        assert not [n for n in nodes.values() if n.after == encoder]
        assert node.label.split("[")[1].startswith("quantize")  # its export was split off
        assert nodes[node.after].upstream == {}
    # an assembly waits for each component's last task of its target
    for node in nodes.values():
        if node.kind == "assemble":
            assert set(node.chains) == {"vision_encoder", "prompt_encoder_mask_decoder"}
            assert all(nodes[c[-1]].targets[-1] in node.targets for c in node.chains.values())
    # nothing runs before what it needs
    order: list[str] = []
    while ready := graph.ready(limit=1):
        (node,) = ready
        assert all(n in order for n in node.needs), node.label
        order.append(node.id)
        node.status = "ok"
    assert len(order) == len(nodes)


def test_graph_outputs_are_plain_builds_outputs(tmp_path) -> None:
    """A matrix of three MLP targets (sharing normalize) gives each target the folder a
    plain `api.build` of it gives (the engine's one-target path, no task graph)."""
    recipe = make_mlp_project(tmp_path)
    recipe.write_text(
        recipe.read_text().split("steps:")[0]
        + "  - {device: cpu, precision: int8}\n  - {device: npu, precision: uint8}\n"
    )
    report = api.matrix([recipe], output_root=tmp_path / "graph", cache_dir=tmp_path / "c1")
    assert report.exit_code == 0, [o.error for o in report.outcomes]
    assert len(report.outcomes) == 4
    shared = [t for t in report.tasks if len(t["targets"]) > 1]
    assert shared, "no task was shared"
    for outcome in report.outcomes:
        plain = api.build(
            recipe,
            device=outcome.device,
            precision=outcome.precision,
            output_root=tmp_path / "plain",
            cache_dir=tmp_path / "c2",
        )
        assert fingerprint(Path(outcome.output_dir)) == fingerprint(plain.output_dir)


def test_a_component_without_steps_ships_its_source_as_a_plain_build_does(tmp_path) -> None:
    recipe = make_mlp_project(tmp_path, steps="[]")
    report = api.matrix([recipe], targets="cpu/fp32", output_root=tmp_path / "graph")
    (outcome,) = report.outcomes
    assert outcome.status == "ok", outcome.error
    assert [t["kind"] for t in report.tasks] == ["assemble"]
    plain = api.build(recipe, device="cpu", precision="fp32", output_root=tmp_path / "plain")
    assert fingerprint(Path(outcome.output_dir)) == fingerprint(plain.output_dir)


def test_two_targets_writing_one_folder_fail_at_once_and_the_first_builds(tmp_path) -> None:
    recipe = make_mlp_project(tmp_path)
    report = api.matrix(
        [recipe, recipe], targets="cpu/fp32", output_root=tmp_path / "b", keep_going=True
    )
    first, second = report.outcomes
    assert first.status == "ok", first.error
    assert (second.status, second.exit_code) == ("failed", 2)
    assert "writes the same folder for the same target" in second.error
    assert report.tasks and all(t["targets"] == [0] for t in report.tasks)


def test_every_components_preflight_runs_before_any_calibration() -> None:
    """The encoder's quantize waits for the decoder's preflight (and the decoder's for the
    encoder's, through its calibration data): the local executor's order puts both checks
    first."""
    from winml_recipes.exec.task import OK
    from winml_recipes.exec.work import TaskResult

    graph, _ = _graph(SAM3, [("npu", "w8a16")])
    nodes = graph.nodes
    checks = {n.component: n.id for n in nodes.values() if n.label.endswith("preflight]")}
    assert set(checks) == {"vision_encoder", "prompt_encoder_mask_decoder"}
    encoder_quantize = next(
        n for n in nodes.values() if n.component == "vision_encoder" and "quantize" in n.label
    )
    assert encoder_quantize.checks == [checks["prompt_encoder_mask_decoder"]]
    order = []
    while (ready := graph.ready(limit=1)) and ready[0].kind == "steps":
        order.append(ready[0].label.split("[")[1].rstrip("]"))
        graph.finish(ready[0], TaskResult(OK))
    assert order[:4] == [
        "export, normalize, fix_shapes, prepare, preflight",  # the encoder's
        "export, normalize, fix_shapes, prepare, preflight",  # the decoder's
        "quantize, verify, compile",  # the encoder's
        "quantize",  # the decoder's (its verify reads the encoder's again: a task of its own)
    ]
