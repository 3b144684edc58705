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
