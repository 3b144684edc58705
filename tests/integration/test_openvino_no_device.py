"""An OpenVINO target on a host where the OpenVINO EP offers no device, on every host.

`onnxruntime-ep-openvino` registers on an AMD host and offers no device: its factory only
claims Intel hardware (docs/eps/openvino.md). The same state is made here on any host with
the real plugin whose bundled OpenVINO has no device plugins (a folder of links to the
package's files without `libopenvino_intel_*`): it registers, and offers nothing. Each case
runs in its own process, since a plugin library is registered once per process.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.conftest import cli_subprocess
from tests.integration.test_openvino import ROW_CONCAT_CATALOG, _row_concat_model
from winml_recipes.eps import openvino

pytestmark = pytest.mark.skipif(
    not (platform.system() == "Linux" and platform.machine() == "x86_64"),
    reason="the plugin copy without device plugins is made from the Linux x86_64 wheel",
)


@pytest.fixture(scope="module")
def no_device_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """WINML_RECIPES_OPENVINO_LIBRARY pointing at the plugin without OpenVINO's devices."""
    import onnxruntime_ep_openvino

    package = Path(onnxruntime_ep_openvino.get_library_path()).parent
    folder = tmp_path_factory.mktemp("openvino-no-device")
    for entry in package.iterdir():
        if entry.name.startswith(("libopenvino_intel_", "__")) or entry.suffix == ".py":
            continue
        try:
            (folder / entry.name).symlink_to(entry)
        except OSError:  # no symlinks here: a copy is the same library
            shutil.copy2(entry, folder / entry.name)
    library = folder / Path(onnxruntime_ep_openvino.get_library_path()).name
    return {"WINML_RECIPES_OPENVINO_LIBRARY": str(library)}


def _python(code: str, env: dict[str, str]) -> str:
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def _no_device_reason() -> str:
    """Why the plugin offers nothing here: this host's CPU vendor where the plugin skips it
    (AMD: test_the_reason_names_the_cpu_vendor_the_plugin_skips), else no device at all."""
    import onnxruntime as ort

    return openvino.no_device_reason(ort.get_ep_devices()) or (
        "OpenVINOExecutionProvider registered but offers no device on this host"
    )


def test_the_plugin_registers_and_offers_no_device(no_device_env) -> None:
    out = _python(
        "from winml_recipes.eps import openvino\n"
        "from winml_recipes.runtime.providers import availability\n"
        "print(openvino.available()); print(availability('openvino').reason)\n"
        "import onnxruntime as ort\n"
        "print(sorted({d.ep_name for d in ort.get_ep_devices()}))\n",
        no_device_env,
    )
    first, again, devices = out.strip().splitlines()[-3:]
    assert first == repr((False, _no_device_reason()))
    assert again == _no_device_reason()  # asked again in the process: the same reason
    assert devices == "['CPUExecutionProvider']"  # registered, nothing offered


def test_the_reason_names_the_cpu_vendor_the_plugin_skips() -> None:
    """The plugin skips hardware devices whose vendor is not Intel (0x8086): the reason says
    so where that is why. Devices as onnxruntime describes them (OrtEpDevice.device)."""

    def cpu(vendor: str, vendor_id: int) -> SimpleNamespace:
        hw = SimpleNamespace(type="OrtHardwareDeviceType.CPU", vendor=vendor, vendor_id=vendor_id)
        return SimpleNamespace(ep_name="CPUExecutionProvider", device=hw)

    why = openvino.no_device_reason([cpu("AMD", 0x1022)])
    assert why == (
        "the plugin offers devices on Intel hardware only; this CPU is AMD's (vendor 0x1022)"
    )
    assert openvino.no_device_reason([cpu("Intel", 0x8086)]) is None
    # this host's own devices, as onnxruntime discovered them
    import onnxruntime as ort

    vendor_ids = {int(d.device.vendor_id) for d in ort.get_ep_devices()}
    expected = None if openvino.INTEL_VENDOR_ID in vendor_ids else "Intel hardware only"
    found = openvino.no_device_reason(ort.get_ep_devices())
    assert found is None if expected is None else expected in found


def _project(root: Path, verify: str = "verify") -> Path:
    (root / "catalog").mkdir(parents=True)
    (root / "recipes").mkdir()
    import onnx

    onnx.save(_row_concat_model(), root / "catalog" / "rowcat.onnx")
    (root / "catalog" / "rowcat.yaml").write_text(ROW_CONCAT_CATALOG)
    recipe = root / "recipes" / "rowcat.yaml"
    recipe.write_text(
        "schema_version: 1\nname: rowcat\nmodel: rowcat\ntargets:\n"
        "  - {device: npu, precision: uint8, ep: openvino}\n"
        f"steps: [{{quantize: {{calibration: {{samples: 4}}}}}}, {verify}]\n"
    )
    return recipe


def test_a_target_falls_back_to_the_cpu_simulation_and_says_why(
    no_device_env, tmp_path: Path
) -> None:
    """OpenVINO's rules still quantize the model; verify runs it on the CPU simulation, and
    the manifest and one console line say why."""
    recipe = _project(tmp_path)
    out = tmp_path / "out"
    env = {**no_device_env, "WINML_RECIPES_CACHE": str(tmp_path / "cache")}
    args = ("build", recipe, "--device", "npu", "--precision", "uint8", "--ep", "openvino")
    done = cli_subprocess(*args, "-o", out, env=env)
    assert done.returncode == 0, done.stderr
    manifest = json.loads((out / "rowcat" / "npu-uint8-openvino" / "manifest.json").read_text())
    steps = {s["pass"]: s for s in manifest["components"]["model"]["steps"]}
    assert list(steps["quantize"]["metrics"]["ep_float_nodes"]) == ["mm_rows"]  # its rules
    verify = steps["verify"]["metrics"]
    assert verify["verified_on"] == "cpu-simulation"
    ep = verify["execution_provider"]
    assert (ep["key"], ep["available"]) == ("openvino", False)
    assert ep["reason"] == _no_device_reason()
    said = " ".join(done.stdout.split())  # one line, or wrapped on a terminal
    assert said.count("verified on cpu-simulation") == 1
    assert (
        "verified on cpu-simulation: OpenVINOExecutionProvider is not available here "
        f"({_no_device_reason()})"
    ) in said


def test_require_ep_fails_in_one_line_and_keeps_the_evidence(no_device_env, tmp_path: Path) -> None:
    recipe = _project(tmp_path, verify="{verify: {require_ep: true}}")
    out = tmp_path / "out"
    env = {**no_device_env, "WINML_RECIPES_CACHE": str(tmp_path / "cache")}
    args = ("build", recipe, "--device", "npu", "--precision", "uint8", "--ep", "openvino")
    done = cli_subprocess(*args, "-o", out, env=env)
    assert done.returncode != 0
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, done.stderr
    assert "requires OpenVINOExecutionProvider (openvino)" in errors[0]
    assert _no_device_reason() in errors[0]
    assert not (out / "rowcat" / "npu-uint8-openvino").exists()
    assert (out / "rowcat" / "npu-uint8-openvino.failed" / "manifest.json").is_file()
