"""The run picture's caption names where the target ran as a person reads it: QNN HTP with
"(emulated on x86_64)" on this kind of host, never the bare EP key."""

from winml_recipes.pictures import _ran
from winml_recipes.sdk.ep import shown_name


def test_the_caption_says_where_the_target_ran_and_that_it_is_emulated() -> None:
    summary = {"target_run": {"model": {"ran_on": "qnn-htp", "model": "b/model/model_ctx.onnx"}}}
    text = _ran(summary)
    assert text == f"{shown_name('qnn-htp')} (model_ctx.onnx)"
    assert text.startswith("QNN HTP")  # the product's name, not the key "qnn-htp"


def test_a_name_recorded_at_run_time_is_kept() -> None:
    record = {"ran_on": "qnn-htp", "target_name": "QNN HTP (emulated on x86_64)", "model": "m.onnx"}
    assert _ran({"target_run": {"m": record}}) == "QNN HTP (emulated on x86_64) (m.onnx)"
