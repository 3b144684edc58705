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


def test_stale_old_links_are_swept_never_followed_nor_put_back(tmp_path: Path) -> None:
    """`.old-<target>-<pid>` links (a planted one, a dangling one) next to a target with no
    output: removed themselves; the folder one points at is untouched and does not become
    the output (rmtree refuses a link, so they were never swept, and the newest was renamed
    into place as the output)."""
    recipe_dir = tmp_path / "mlp"
    recipe_dir.mkdir()
    elsewhere = tmp_path / "users-folder"
    elsewhere.mkdir()
    (elsewhere / "keep.txt").write_text("mine")
    planted = recipe_dir / ".old-cpu-fp32-4242"
    planted.symlink_to(elsewhere, target_is_directory=True)
    dangling = recipe_dir / ".old-cpu-fp32-4243"
    dangling.symlink_to(tmp_path / "gone", target_is_directory=True)
    failed_link = recipe_dir / ".old-cpu-fp32.failed-4244"
    failed_link.symlink_to(elsewhere, target_is_directory=True)
    staging_link = recipe_dir / ".staging-cpu-fp32-4245"
    staging_link.symlink_to(elsewhere, target_is_directory=True)
    recover_output(recipe_dir / "cpu-fp32")
    assert sorted(p.name for p in recipe_dir.iterdir()) == []
    assert (elsewhere / "keep.txt").read_text() == "mine"
