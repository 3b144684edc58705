"""The object-detection (box F1) and text-recognition (CTC) task metric plugins."""

from __future__ import annotations

import numpy as np
import pytest

from winml_recipes.metrics.detection import BoxF1, layout
from winml_recipes.metrics.text import CharacterAgreement
from winml_recipes.sdk.contract import IOContract, TensorSpec
from winml_recipes.sdk.metrics import metric_for, task_metrics


def _decoded(boxes, labels) -> dict[str, np.ndarray]:
    scores = np.zeros((len(boxes), 2))
    scores[np.arange(len(boxes)), labels] = 0.9
    return {"boxes": np.asarray(boxes, float)[None], "scores": scores[None]}


def test_box_f1_counts_moved_missing_and_relabelled_boxes() -> None:
    f1 = BoxF1()
    ref = _decoded([[0, 0, 10, 10], [20, 20, 40, 40]], [0, 1])
    assert layout(list(ref.values())) == "boxes"
    assert f1.values([ref], [ref])["box_f1"] == 1.0
    moved = _decoded([[6, 6, 16, 16], [20, 20, 40, 40]], [0, 1])  # IoU 0.12 < 0.5
    assert f1.values([ref], [moved])["box_f1"] == pytest.approx(0.5)
    relabelled = _decoded([[0, 0, 10, 10], [20, 20, 40, 40]], [0, 0])
    assert f1.values([ref], [relabelled])["box_f1"] == pytest.approx(0.5)
    missing = f1.values([ref], [_decoded([[0, 0, 10, 10]], [0])])
    assert missing["box_f1"] == pytest.approx(2 / 3)
    assert (missing["box_precision"], missing["box_recall"]) == (1.0, 0.5)


def _yolox(cells: dict[int, tuple[float, float]], h: int, w: int) -> dict[str, np.ndarray]:
    """A raw YOLOX head for an h x w input: one confident object per given row (dx, dy)."""
    rows = sum((h // s) * (w // s) for s in (8, 16, 32))
    pred = np.zeros((1, rows, 6), np.float32)
    for row, (dx, dy) in cells.items():
        pred[0, row] = [dx, dy, 1.0, 1.0, 0.9, 0.9]
    return {"output": pred}


def test_yolox_grid_is_sized_from_the_input_and_moved_boxes_miss() -> None:
    contract = IOContract(
        inputs=(TensorSpec("images", "float32", (1, 3, "h", 96)),),
        outputs=(TensorSpec("output", "float32", (1, "n", 6)),),
        dims={"h": 64},
    )
    metric = BoxF1().for_contract(contract)
    assert metric.size == (64, 96)
    ref = _yolox({0: (0, 0), 20: (0, 0)}, 64, 96)
    assert metric.values([ref], [ref])["box_f1"] == 1.0
    # the second object moved by two stride-8 cells: its box (about 22 px wide) misses
    moved = _yolox({0: (0, 0), 20: (2.0, 0)}, 64, 96)
    assert metric.values([ref], [moved])["box_f1"] == pytest.approx(0.5)
    # a square input of another size cannot read the rows: said, not guessed
    with pytest.raises(ValueError, match="yolox layout"):
        BoxF1((96, 96)).values([ref], [ref])


def test_score_map_proposals_follow_the_probability_and_the_offsets() -> None:
    prob = np.zeros((1, 2, 10, 10), np.float32)
    prob[0, 1, 2, 3] = prob[0, 1, 7, 7] = 0.9
    offsets = np.zeros((1, 4, 10, 10), np.float32)
    ref = {"offsets": offsets, "face_prob": prob}
    assert layout(list(ref.values())) == "score-map"
    f1 = BoxF1()
    assert f1.values([ref], [ref])["box_f1"] == 1.0
    shifted = offsets.copy()
    shifted[0, :, 7, 7] = 0.5  # the box moves by half its 12-pixel cell
    assert f1.values([ref], [{"offsets": shifted, "face_prob": prob}])["box_f1"] == 0.5
    weak = prob.copy()
    weak[0, 1, 2, 3] = 0.5  # under the 0.6 threshold: one face lost
    assert f1.values([ref], [{"offsets": offsets, "face_prob": weak}])["box_recall"] == 0.5


def _steps(ids: list[int], time_first: bool) -> dict[str, np.ndarray]:
    x = np.zeros((len(ids), 5), np.float32)
    x[np.arange(len(ids)), ids] = 1
    return {"out": x[:, None] if time_first else x[None]}


@pytest.mark.parametrize("time_first", [True, False])
def test_ctc_character_agreement_merges_repeats_and_drops_blanks(time_first: bool) -> None:
    metric = CharacterAgreement()
    want = _steps([1, 1, 0, 2, 0, 3], time_first)  # reads 1 2 3
    same_text = _steps([1, 0, 2, 2, 2, 3], time_first)  # other steps, same text
    assert metric.values([want], [same_text])["character_agreement"] == 1.0
    one_wrong = metric.values([want], [_steps([1, 1, 0, 2, 0, 4], time_first)])
    assert one_wrong["character_agreement"] == pytest.approx(2 / 3)
    assert one_wrong["line_agreement"] == 0.0
    longer = metric.values([want], [_steps([1, 1, 1, 2, 0, 3], time_first)])
    assert longer["character_agreement"] == 1.0  # a repeat is still one character
    merged = metric.values([want], [_steps([1, 1, 1, 1, 0, 3], time_first)])
    assert merged["character_agreement"] == pytest.approx(2 / 3)


def test_tasks_name_the_plugins() -> None:
    assert {"box-f1", "ctc-character-agreement"} <= set(task_metrics())
    outputs = (TensorSpec("output", "float32", (1, 3549, 6)),)
    found = metric_for("object-detection", IOContract(outputs=outputs))
    assert found is not None and found.name == "box-f1"
    found = metric_for("text-recognition", IOContract(outputs=outputs))
    assert found is not None and found.name == "ctc-character-agreement"


def test_span_token_and_zero_shot_agreement() -> None:
    """Span agreement counts a sample only when both ends agree; token agreement is per
    token; zero-shot flips are measured against the float margin."""
    import numpy as np

    from winml_recipes.metrics.spans import SpanAgreement, TokenLabelAgreement
    from winml_recipes.metrics.zeroshot import zero_shot_agreement

    ref = [{"start_logits": np.array([[0.0, 5, 1]]), "end_logits": np.array([[0.0, 1, 5]])}]
    moved_end = [{"start_logits": np.array([[0.0, 5, 1]]), "end_logits": np.array([[0.0, 6, 5]])}]
    values = SpanAgreement().values(ref * 2, [ref[0], moved_end[0]])
    assert (values["span_agreement"], values["start_agreement"], values["end_agreement"]) == (
        0.5, 1.0, 0.5,
    )  # fmt: skip
    logits = np.zeros((1, 4, 3))
    logits[0, np.arange(4), [0, 1, 2, 1]] = 1
    changed = logits.copy()
    changed[0, 3] = [0, 0, 2]
    values = TokenLabelAgreement().values([{"logits": logits}], [{"logits": changed}])
    assert values["token_agreement"] == 0.75 and values["tokens"] == 4
    images, texts = np.eye(3)[:2], np.eye(3)
    near = images + np.array([[0, 1.5, 0], [0, 0, 0]])  # image 0 now closer to label 1
    values = zero_shot_agreement((images, texts), (near, texts))
    assert values["top1_agreement"] == 0.5 and values["flip_margin_max"] == 1.0
