"""Which divergence repair is kept (quant/repair.py `keeps`): judged by the target against
float, never by agreement alone."""

from winml_recipes.quant.repair import Measured, keeps

# the build before a repair: HTP departs from the simulation at the logits
BEFORE = Measured(target={"logits": 1.0}, simulation={"logits": 23.3}, apart={"logits": 1.2})


def test_a_repair_that_makes_the_target_agree_and_better_is_kept() -> None:
    after = Measured(target={"logits": 22.8}, simulation={"logits": 23.1}, apart={"logits": 35.0})
    assert keeps(BEFORE, after)


def test_a_repair_that_spoils_the_simulation_too_is_not_kept() -> None:
    """Target and simulation agree afterwards only because both are now wrong: the
    MobileViT case (simulated logits 23.3 -> -0.5 dB after a shared encoding)."""
    after = Measured(target={"logits": -0.6}, simulation={"logits": -0.5}, apart={"logits": 30.0})
    assert not after.departs()  # what the old rule kept it for
    assert not keeps(BEFORE, after)


def test_a_repair_is_judged_by_its_worst_output() -> None:
    before = Measured(target={"a": 5.0, "b": 30.0}, simulation={"a": 25.0, "b": 31.0},
                      apart={"a": 4.0, "b": 40.0})  # fmt: skip
    after = Measured(target={"a": 24.0, "b": 3.0}, simulation={"a": 25.0, "b": 3.5},
                     apart={"a": 30.0, "b": 30.0})  # fmt: skip
    assert not keeps(before, after)


def test_a_repair_that_spoils_the_simulation_is_not_kept_for_a_hair_of_target() -> None:
    """Measured on the tiny MobileViT before its fixture's BatchNorm fix: a shared encoding
    at a Concat moved the target from -6.39 to -6.34 dB and the simulation from 23.33 to
    -0.46 dB; it was kept (the two then 'agreed')."""
    before = Measured(target={"logits": -6.39}, simulation={"logits": 23.33},
                      apart={"logits": -6.66})  # fmt: skip
    after = Measured(target={"logits": -6.34}, simulation={"logits": -0.46},
                     apart={"logits": -20.41})  # fmt: skip
    assert not keeps(before, after)


def test_a_tensor_the_simulation_keeps_nothing_of_is_not_where_the_target_departs() -> None:
    """The tiny MobileViT's attention scores (1e-20) came out at 0.0 dB vs float in the
    simulation and -200 dB on HTP, then a Softmax made both uniform: the search named them
    as where HTP departed, and no repair can make the target beat a simulation at 0 dB."""
    from pathlib import Path

    from winml_recipes.quant.divergence import TensorRow
    from winml_recipes.quant.prefixes import PrefixSearch

    search = PrefixSearch(None, [], [], [], None, Path("."), 20.0, 6.0)  # rows given below
    search.rows[0] = TensorRow("div_1", "Div", "node_div_1", -200.0, 0.0, -200.0)
    search.rows[1] = TensorRow("silu_12", "Mul", "node_silu_12", 9.8, 35.7, 9.8)
    assert not search.departs(0)
    assert search.departs(1)
