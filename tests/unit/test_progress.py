"""Progress lines without a terminal: quiet for short steps, counts and an ETA for long ones."""

from __future__ import annotations

import io
from types import SimpleNamespace

import winml_recipes.progress as progress
from winml_recipes.sdk.records import StepRecord


def _step(name: str = "quantize"):
    return SimpleNamespace(name=name)


def _record(status: str) -> StepRecord:
    return StepRecord(
        pass_name="quantize", implementation="x.Quantize", version=1, options={}, status=status
    )


def test_short_steps_print_one_line_each() -> None:
    """Without a terminal every step says it ended (a CI log shows the build moving), and
    its counts only when it runs long."""
    out = io.StringIO()
    lines = progress.step_lines(out, prefix="sam3-tiny cpu/int8")
    lines.step_started("enc", _step())
    for i in range(1, 17):
        lines.step_progress("enc", _step(), "calibration samples", i, 16)
    lines.step_finished("enc", _step(), _record("ran"))
    lines.step_started("enc", _step("verify"))
    lines.step_finished("enc", _step("verify"), _record("cached"))
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
    lines.step_finished("enc", _step(), _record("ran"))
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
    lines.step_finished("enc", _step("export"), _record("ran"))
    assert out.getvalue() == "enc: export [ran] in 60.0 s\n"


def _render_live_view(width: int) -> list[str]:
    """The rich live view after some steps, rendered as a terminal `width` wide shows it."""
    from rich.console import Console

    console = Console(width=width, record=True, file=io.StringIO(), force_terminal=True)
    view = progress._Rich(console=console)
    long = "prompt_encoder_mask_decoder"
    view.step_started("vision_encoder", _step("export"))
    view.step_finished("vision_encoder", _step("export"), _record("cached"))
    view.step_started(long, _step("quantize"))
    view.step_progress(long, _step("quantize"), "calibration samples", 45, 64)
    console.print(view.progress.get_renderable())
    return console.export_text().splitlines()


def test_live_view_keeps_counts_and_times_at_80_columns() -> None:
    """At 80 columns names are shortened, never the counts, elapsed time or ETA."""
    lines = _render_live_view(80)
    assert all(len(line) <= 80 for line in lines), lines
    running = next(line for line in lines if "45/64" in line)
    assert "…" not in running.split("45/64", 1)[1], running
    times = running.split("45/64", 1)[1].split()
    assert len(times) == 2 and all(len(t.split(":")) == 3 for t in times), running
    assert "prompt_enc" in running  # the name is shortened, not dropped
    assert any("vision_encoder: export [cached]" in line for line in lines), lines


def test_live_view_shows_whole_names_when_there_is_room() -> None:
    lines = _render_live_view(160)
    assert any("prompt_encoder_mask_decoder: quantize calibration samples" in line
               for line in lines), lines  # fmt: skip
    assert any("45/64" in line for line in lines)


def test_live_view_shows_the_whole_step_time_after_several_counts() -> None:
    """verify counts reference samples (quick), then samples on the target (minutes): the
    time shown when it ends is the step's, as the manifest records it, not the first
    count's (the live view showed `verify [ran] 8/8 0:00:01` for a 202 s step)."""
    from dataclasses import replace

    from rich.console import Console
    from rich.progress import TimeElapsedColumn

    now = [0.0]
    view = progress._Rich(Console(file=io.StringIO(), width=80, force_terminal=True))
    view.progress.get_time = lambda: now[0]  # the view's clock, moved by hand
    verify = _step("verify")
    with view:
        view.step_started("model", verify)
        view.step_progress("model", verify, "reference samples", 8, 8)
        now[0] = 120.0
        view.step_progress("model", verify, "samples on the target", 4, 8)
        live = str(TimeElapsedColumn().render(view.progress.tasks[-1]))
        now[0] = 201.5
        view.step_progress("model", verify, "samples on the target", 8, 8)
        view.step_finished("model", verify, replace(_record("ran"), wall_seconds=202.0))
        done = str(TimeElapsedColumn().render(view.progress.tasks[-1]))
    assert (live, done) == ("0:02:00", "0:03:22")
