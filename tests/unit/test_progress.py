"""Progress lines without a terminal: quiet for short steps, counts and an ETA for long ones."""

from __future__ import annotations

import io
from types import SimpleNamespace

import winml_recipes.progress as progress


def _step(name: str = "quantize"):
    return SimpleNamespace(name=name)


def test_short_steps_print_one_line_each() -> None:
    """Without a terminal every step says it ended (a CI log shows the build moving), and
    its counts only when it runs long."""
    out = io.StringIO()
    lines = progress.step_lines(out, prefix="sam3-tiny cpu/int8")
    lines.step_started("enc", _step())
    for i in range(1, 17):
        lines.step_progress("enc", _step(), "calibration samples", i, 16)
    lines.step_finished("enc", _step(), {"status": "ran"})
    lines.step_started("enc", _step("verify"))
    lines.step_finished("enc", _step("verify"), {"status": "cached"})
    text = out.getvalue().splitlines()
    assert len(text) == 2, text
    assert text[0].startswith("sam3-tiny cpu/int8 enc: quantize [ran] in 0.")
    assert text[1].startswith("sam3-tiny cpu/int8 enc: verify [cached] in 0.")
    assert text[0].endswith(" s")


def test_long_steps_log_counts_eta_and_the_end(monkeypatch) -> None:
    monkeypatch.setattr(progress, "LOG_AFTER_SECONDS", 0.0)
    monkeypatch.setattr(progress, "LOG_EVERY_SECONDS", 0.0)
    clock = iter(float(t) for t in range(100))
    monkeypatch.setattr(progress.time, "monotonic", lambda: next(clock))
    out = io.StringIO()
    lines = progress._Lines(out)
    lines.step_started("enc", _step())  # t = 0
    lines.step_progress("enc", _step(), "calibration samples", 1, 4)
    lines.step_progress("enc", _step(), "calibration samples", 2, 4)
    lines.step_finished("enc", _step(), {"status": "ran"})
    text = out.getvalue().splitlines()
    assert text[0].startswith("enc: quantize: calibration samples 1/4 (")
    assert "s left)" in text[1] and text[1].startswith("enc: quantize: calibration samples 2/4")
    assert text[-1].startswith("enc: quantize [ran] in ")


def test_a_long_step_without_counts_logs_its_end(monkeypatch) -> None:
    clock = iter([0.0, 60.0, 60.0, 60.0])
    monkeypatch.setattr(progress.time, "monotonic", lambda: next(clock))
    out = io.StringIO()
    lines = progress._Lines(out)
    lines.step_started("enc", _step("export"))
    lines.step_finished("enc", _step("export"), {"status": "ran"})
    assert out.getvalue() == "enc: export [ran] in 60.0 s\n"
