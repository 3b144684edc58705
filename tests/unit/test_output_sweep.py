"""Leftover sweeps before a build touch only that target's own folders.

Targets of one recipe share a parent folder, and one target's folder name can start with
another's (`npu-uint8`, `npu-uint8-openvino`). Executors that build targets side by side
(pool, Ray) start one target's build while another assembles in its staging folder.
"""

from __future__ import annotations

from pathlib import Path

from filelock import FileLock

from winml_recipes.engine.run import lock_path_for, recover_output


def test_a_sweep_leaves_a_running_build_of_a_longer_named_target_alone(tmp_path: Path) -> None:
    recipe_dir = tmp_path / "sam3-tiny"
    running = recipe_dir / ".staging-npu-uint8-openvino-4242"  # being assembled right now
    (running / "vision_encoder").mkdir(parents=True)
    (running / "vision_encoder" / "graph.yaml").write_text("opsets: {}\n")
    own_stale = recipe_dir / ".staging-npu-uint8-1717"  # npu-uint8's, interrupted
    own_stale.mkdir()
    own_old = recipe_dir / ".old-npu-uint8-1717"  # npu-uint8's output mid-swap
    (own_old / "model").mkdir(parents=True)
    other_old = recipe_dir / ".old-npu-uint8-openvino-4242"  # the running build's swap
    other_old.mkdir()
    with FileLock(str(lock_path_for(recipe_dir / "npu-uint8-openvino"))):
        recover_output(recipe_dir / "npu-uint8")
        assert (running / "vision_encoder" / "graph.yaml").is_file()
        assert other_old.is_dir()
    assert not own_stale.exists()
    assert (recipe_dir / "npu-uint8" / "model").is_dir()  # its interrupted swap put back
    assert not own_old.exists()
