"""Intel OpenVINO: the `onnxruntime-ep-openvino` plugin EP (Intel CPUs, GPUs and NPUs).

Everything the tool knows about OpenVINO lives here; the facts behind it (measured with
onnxruntime-ep-openvino 1.8.1, OpenVINO 2026.4.1 bundled) are in docs/eps/openvino.md.

- Devices: the plugin offers one onnxruntime EP device per OpenVINO device
  (`ep_metadata["ov_device"]`: CPU, GPU, NPU) and a meta device under another EP name
  (`OpenVINOExecutionProvider.AUTO`). The device is chosen by which EP device a session
  selects: the plugin ignores the `device_type` provider option (it logs so). Here
  `device_type` is our option: it picks the EP device and is not passed on.
- A target's device maps to an OpenVINO device: npu -> NPU, gpu -> GPU, cpu -> CPU. Where
  the NPU (or GPU) is missing, the CPU device stands in, and `device_info` records it.
- Quantization (`OpenVinoQuantRules`): OpenVINO's own scheme, from NNCF's hardware config
  for the NPU (nncf/common/hardware/configs/npu.json) and OpenVINO's "mixed" preset:
  8-bit activations, unsigned and asymmetric (per tensor); 8-bit signed weights, symmetric,
  per channel; quantized inputs only for the op types that config quantizes; one scale for
  the inputs of the element-wise ops and Concat it marks `scales: unified`.
- Compile: none. The plugin writes EPContext models (`ep.context_enable`), but the blob is
  compiled for the device the session ran on: one made on this host's CPU device is no
  NPU artifact. The deployable file is the QDQ model; OpenVINO compiles it at load.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from winml_recipes.sdk.ep import ExecutionProvider, QuantRules, register_library_once
from winml_recipes.sdk.ranges import TiedTensors, unify_ranges

if TYPE_CHECKING:
    import onnx
    import onnxruntime as ort

EP_NAME = "OpenVINOExecutionProvider"
PACKAGE = "onnxruntime-ep-openvino"
# The plugin's factory offers an EP device only for onnxruntime hardware devices whose
# vendor id is Intel's (its GetSupportedDevices skips the rest), so on an AMD host it
# registers and offers nothing; no provider, session or OpenVINO option changes that
# (docs/eps/openvino.md, "Which hosts it offers a device on").
INTEL_VENDOR_ID = 0x8086
DEVICE_OPTION = "device_type"  # ours: CPU, GPU or NPU; consumed by select_devices
# The OpenVINO device each target device asks for, then what stands in when it is missing.
OV_DEVICES: Mapping[str, tuple[str, ...]] = {
    "npu": ("NPU", "CPU"),
    "gpu": ("GPU", "CPU"),
    "cpu": ("CPU",),
}

# ONNX op types whose inputs NNCF's NPU hardware config quantizes (its OpenVINO op names in
# comments where they differ). Not listed there, so left float here: ConvTranspose
# (ConvolutionBackpropData is in the CPU config only), Softmax, LayerNormalization, Gelu,
# and the data-movement ops (Reshape, Transpose, Slice, Concat, ...), which NNCF lets a
# quantizer pass through instead of quantizing. Logical ops (bool tensors) have nothing
# to quantize.
QUANTIZED_OP_TYPES: tuple[str, ...] = (
    "Conv",  # Convolution, DepthWiseConvolution
    "MatMul",
    "Gemm",  # MatMul in OpenVINO
    "Add",
    "Sub",  # Subtract
    "Mul",  # Multiply
    "Div",  # Divide
    "Max",  # Maximum
    "Min",  # Minimum
    "Pow",  # Power
    "Mod",  # FloorMod
    "Equal",
    "Less",
    "LessOrEqual",
    "Greater",
    "GreaterOrEqual",
    "AveragePool",  # AvgPool
    "GlobalAveragePool",
    "LpNormalization",  # NormalizeL2
    "ReduceL2",
    "ReduceMean",
    "ReduceSum",
    "Resize",  # Interpolate
    "MeanVarianceNormalization",  # MVN
    "GroupNormalization",
)
# The ops NNCF's NPU config marks `scales: unified`: their quantized inputs share one scale.
UNIFIED_SCALE_OP_TYPES = frozenset(
    {
        "Add",
        "Sub",
        "Mul",
        "Div",
        "Max",
        "Min",
        "Mod",
        "Equal",
        "Less",
        "LessOrEqual",
        "Greater",
        "GreaterOrEqual",
        "Concat",
    }
)


def unified_scale_groups(model: onnx.ModelProto, activations: Sequence[str]) -> list[list[str]]:
    """Sets of calibrated activations that must share one range (transitively merged): the
    activation inputs of each op in UNIFIED_SCALE_OP_TYPES."""
    acts = set(activations)
    tied = TiedTensors()
    for node in model.graph.node:
        if node.op_type in UNIFIED_SCALE_OP_TYPES:
            tied.tie(list(dict.fromkeys(t for t in node.input if t in acts)))
    return sorted(tied.groups())


# Why a MatMul or Gemm with a constant weight whose data input is a Concat along a row
# axis stays float (docs/eps/openvino.md, "Concat feeding a MatMul"): OpenVINO's
# ConcatTransformation gives the Concat's dequantization one zero point per slice along the
# Concat axis (even when every input has the same one), and MatMulTransformation cannot
# broadcast a zero point that varies along a row axis of its data input: the model does not
# load ("[MatMulTransformation] ... cannot be broadcasted"). Measured with OpenVINO 2026.4
# (onnxruntime-ep-openvino 1.8.1) on graphs of 2-4 dimensions and Concat axes 0-2; a
# Concat along the contracted (last) axis, a Reshape or a quantized Add between, a zero
# point of 0, or two activation inputs load.
CONCAT_ROWS_REASON = (
    "OpenVINO cannot load a quantized {op} whose data input is a Concat along axis {axis} "
    "(a row axis, not the contracted one): its MatMul int8 transformation cannot broadcast "
    "the per-slice zero point; left float"
)


def _contracted_axis(node: onnx.NodeProto, rank: int) -> int:
    """The axis of the data input (A) a MatMul or Gemm contracts."""
    if node.op_type == "Gemm":
        trans_a = next((a.i for a in node.attribute if a.name == "transA"), 0)
        return 0 if trans_a else 1
    return rank - 1


def _ranks(model: onnx.ModelProto, names: set[str]) -> dict[str, int]:
    """Ranks of `names` from the declared value infos, else from shape inference."""
    infos = [*model.graph.value_info, *model.graph.input, *model.graph.output]
    ranks = {
        vi.name: len(vi.type.tensor_type.shape.dim)
        for vi in infos
        if vi.name in names and vi.type.tensor_type.HasField("shape")
    }
    if names - set(ranks):
        import onnx

        from winml_recipes.onnx.lightview import light_view

        try:  # on a view without the weights' bytes
            inferred = onnx.shape_inference.infer_shapes(light_view(model))
        except Exception:  # unknown domains...: what the model declares
            return ranks
        for vi in inferred.graph.value_info:
            if vi.name in names and vi.type.tensor_type.HasField("shape"):
                ranks.setdefault(vi.name, len(vi.type.tensor_type.shape.dim))
    return ranks


def concat_row_matmuls(model: onnx.ModelProto) -> dict[str, str]:
    """MatMul/Gemm nodes with a constant weight whose data input is a Concat along a row
    axis (not the contracted one): node name -> why it stays float (CONCAT_ROWS_REASON).
    Only the top-level graph: the quantizer does not quantize subgraphs."""
    graph = model.graph
    constants = {t.name for t in graph.initializer}
    constants |= {o for n in graph.node if n.op_type == "Constant" for o in n.output}
    concats = {n.output[0]: n for n in graph.node if n.op_type == "Concat" and n.output}
    candidates = [
        n
        for n in graph.node
        if n.op_type in ("MatMul", "Gemm")
        and len(n.input) >= 2
        and n.input[1] in constants
        and n.input[0] in concats
        and n.name  # the quantizer excludes nodes by name
    ]
    ranks = _ranks(model, {n.input[0] for n in candidates})
    out: dict[str, str] = {}
    for node in candidates:
        concat = concats[node.input[0]]
        axis = next((a.i for a in concat.attribute if a.name == "axis"), 0)
        rank = ranks.get(node.input[0])
        if rank is None:  # unknown rank: only a last-axis Concat (-1) is known to load
            if axis == -1:
                continue
            out[node.name] = CONCAT_ROWS_REASON.format(op=node.op_type, axis=axis)
            continue
        axis = axis % rank if rank else axis
        if axis != _contracted_axis(node, rank):
            out[node.name] = CONCAT_ROWS_REASON.format(op=node.op_type, axis=axis)
    return out


@dataclass
class OpenVinoQuantRules(QuantRules):
    """OpenVINO's QDQ scheme (see the module docstring); what onnxruntime's quantizer
    needs to write it."""

    def float_nodes(self, model: onnx.ModelProto) -> dict[str, str]:
        return concat_row_matmuls(model)

    def adjust_ranges(
        self, model: onnx.ModelProto, ranges: dict[str, Any], tensors: Sequence[str]
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        groups = unified_scale_groups(model, [t for t in tensors if t in ranges])
        return unify_ranges(ranges, groups), {"unified_scales": groups}

    def quantizer_args(
        self,
        src: Path,
        cfg: Any,
        overrides: dict[str, list[dict[str, Any]]],
        exclude: list[str],
    ) -> dict[str, Any] | None:
        from onnxruntime.quantization import QuantFormat

        from winml_recipes.quant.ort import static_args, typed_overrides

        # the generic arguments, always QDQ, on OpenVINO's op types; mixed precision's
        # overrides as they are (ORT's fixer has added the converts)
        return static_args(
            cfg,
            QuantFormat.QDQ,
            list(cfg.op_types) or list(QUANTIZED_OP_TYPES),
            typed_overrides(overrides) if overrides else None,
            exclude,
        )


QUANT_RULES = OpenVinoQuantRules(
    name="openvino",
    defaults={
        "activation_type": "uint8",
        "activation_symmetric": False,
        "weight_type": "int8",
        "weight_symmetric": True,
        "per_channel": True,
    },
    # int8 activations: OpenVINO's CPU device cannot compile the sam3-tiny encoder
    # ("No suitable implementations", docs/eps/openvino.md); NNCF's NPU config has no
    # 16-bit activations.
    allowed={"activation_type": ("uint8",), "weight_type": ("int8",)},
    revision=1,  # 1: MatMuls fed by a row-axis Concat stay float
)


@dataclass(frozen=True)
class DeviceInfo:
    """The OpenVINO device a session runs on, for the manifest."""

    ov_device: str  # CPU, GPU, NPU
    name: str  # FULL_DEVICE_NAME
    requested: str  # the OpenVINO device the target asked for
    ep_library: str = ""  # the plugin's own version string

    @property
    def stand_in(self) -> bool:
        return self.ov_device != self.requested

    def to_manifest(self) -> dict[str, Any]:
        out = {"ov_device": self.ov_device, "name": self.name, "requested": self.requested}
        if self.stand_in:
            out["stand_in"] = f"no {self.requested} device on this host; ran on {self.ov_device}"
        return out


def no_device_reason(devices: Sequence[Any]) -> str | None:
    """Why the registered plugin offers no device, in one line, when the cause is the
    host's hardware vendor (see INTEL_VENDOR_ID); None when it is something else."""
    vendors = {
        (str(d.device.vendor), int(d.device.vendor_id))
        for d in devices
        if str(d.device.type).endswith("CPU")
    }
    others = sorted(v for v in vendors if v[1] != INTEL_VENDOR_ID)
    if not others or len(others) < len(vendors):
        return None
    name, vendor_id = others[0]
    return (
        f"the plugin offers devices on Intel hardware only; this CPU is "
        f"{name or 'another vendor'}'s (vendor 0x{vendor_id:04x})"
    )


def _ov_device(d: Any) -> str:
    return str(d.ep_metadata.get("ov_device", ""))


def _wanted(device: str | None, options: Mapping[str, str] | None) -> tuple[str, ...]:
    if options and options.get(DEVICE_OPTION):
        return (str(options[DEVICE_OPTION]).upper(),)  # asked for by name: no stand-in
    return OV_DEVICES.get(device or "npu", ("CPU",))


def choose_device(
    devices: Sequence[Any], device: str | None = None, options: Mapping[str, str] | None = None
) -> tuple[Any, str] | None:
    """The one OpenVINO EP device a session on `device` uses, and the OpenVINO device it
    asked for; None when neither it nor a stand-in is here."""
    ours = [d for d in devices if d.ep_name == EP_NAME]
    wanted = _wanted(device, options)
    for name in wanted:
        for d in ours:
            if _ov_device(d) == name:
                return d, wanted[0]
    return None


@dataclass(frozen=True)
class OpenVino(ExecutionProvider):
    provider_only_options: frozenset[str] = field(default=frozenset({DEVICE_OPTION}))

    def select_devices(self, devices: Sequence[Any], device: str | None = None) -> list[Any]:
        found = choose_device(devices, device, self.options)
        return [found[0]] if found else []

    def provider_options(
        self, device: str | None = None, extra: Mapping[str, str] | None = None
    ) -> dict[str, str]:
        merged = {**self.options, **(extra or {})}
        return {k: v for k, v in merged.items() if k not in self.provider_only_options}

    def versions(self) -> dict[str, str]:
        out = super().versions()
        info = device_info("npu")
        if info is not None:  # the manifest's record of the device a build ran on
            out["openvino_ep_library"] = info.ep_library
            out["openvino_device"] = f"{info.ov_device}: {info.name}" + (
                f" (standing in for the {info.requested})" if info.stand_in else ""
            )
        return out

    def no_device_reason(self, devices: Sequence[Any]) -> str | None:
        return no_device_reason(devices)

    def emulation_note(self) -> str | None:
        info = device_info("npu")
        if info is not None and info.stand_in:
            return f"OpenVINO {info.ov_device} device standing in for the {info.requested}"
        return None


PLUGIN = OpenVino(
    key="openvino",
    provider=EP_NAME,
    devices=frozenset({"npu", "gpu", "cpu"}),
    description="Intel OpenVINO (CPU, GPU, NPU devices); onnxruntime-ep-openvino",
    library_module="onnxruntime_ep_openvino",
    package=PACKAGE,
    library_env="WINML_RECIPES_OPENVINO_LIBRARY",
    quant_rules=QUANT_RULES,
    compiles=None,
)


# -- loading and sessions ---------------------------------------------------------------


def available() -> tuple[bool, str]:
    """Register the plugin library once per process: (True, "") or (False, why, one line)."""
    try:
        library = PLUGIN.library_path()
    except (ImportError, FileNotFoundError):
        return False, f"the Python package '{PLUGIN.library_module}' is not installed " + (
            f"(pip install {PACKAGE}, or the 'openvino' extra)"
        )
    if not Path(library).is_file():
        return False, f"OpenVINO EP library not found: {library}"
    import onnxruntime as ort

    if not [d for d in ort.get_ep_devices() if d.ep_name == EP_NAME]:
        try:
            register_library_once(EP_NAME, library)
        except Exception as exc:  # onnxruntime raises Fail with the loader's message
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
            return False, f"cannot load {library}: {first}"
    if not [d for d in ort.get_ep_devices() if d.ep_name == EP_NAME]:
        why = no_device_reason(ort.get_ep_devices())
        return False, why or f"{EP_NAME} registered but offers no device on this host"
    return True, ""


def device_info(device: str, options: Mapping[str, str] | None = None) -> DeviceInfo | None:
    """The OpenVINO device a session for `device` runs on here, or None (not loadable)."""
    if not available()[0]:
        return None
    import onnxruntime as ort

    found = choose_device(ort.get_ep_devices(), device, options or PLUGIN.options)
    if found is None:
        return None
    d, requested = found
    return DeviceInfo(
        ov_device=_ov_device(d),
        name=str(d.ep_metadata.get("FULL_DEVICE_NAME", "")),
        requested=requested,
        ep_library=str(d.ep_metadata.get("version", "")),
    )


def versions() -> dict[str, str]:
    """onnxruntime, the plugin's distribution and its library version (manifest, cache key)."""
    return PLUGIN.versions()


def open_session(
    model: Path | str,
    device: str = "npu",
    options: Mapping[str, str] | None = None,
    *,
    fallback: bool = False,
) -> tuple[ort.InferenceSession, DeviceInfo]:
    """A session on the OpenVINO device for `device` (every node on OpenVINO unless
    `fallback`), and the device it runs on. Raises ExecutionProviderError when OpenVINO
    cannot load here or refuses the model."""
    import onnxruntime as ort

    from winml_recipes.runtime.sessions import session_options
    from winml_recipes.sdk.errors import ExecutionProviderError

    ok, why = available()
    if not ok:
        raise ExecutionProviderError(f"{EP_NAME} cannot be used here: {why}")
    wanted = {**PLUGIN.options, **(options or {})}
    found = choose_device(ort.get_ep_devices(), device, wanted)
    if found is None:
        raise ExecutionProviderError(
            f"{EP_NAME} offers no {'/'.join(_wanted(device, wanted))} device on this host; "
            f"choose another {DEVICE_OPTION}"
        )
    so = session_options()
    so.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
    if not fallback:
        so.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
    so.add_provider_for_devices([found[0]], PLUGIN.provider_options(device, options))
    try:
        session = ort.InferenceSession(str(model), sess_options=so)
    except Exception as exc:
        text = " ".join(str(exc).split())[:300]
        raise ExecutionProviderError(
            f"{EP_NAME} cannot load the model: {text}", where=str(model)
        ) from None
    info = device_info(device, wanted)
    assert info is not None
    return session, info


def placement(session: ort.InferenceSession) -> dict[str, int]:
    """Nodes per EP of a session opened with placement recorded."""
    nodes: dict[str, int] = {}
    for sub in session.get_provider_graph_assignment_info():
        nodes[sub.ep_name] = nodes.get(sub.ep_name, 0) + len(sub.get_nodes())
    return nodes
