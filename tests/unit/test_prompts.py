"""SAM prompts in the photo's pixels -> the model's frame; padding, limits, parsing."""

from __future__ import annotations

import numpy as np
import pytest

from winml_recipes.prompts import Box, Point, default_prompts, parse_box, parse_point, prompt_feeds
from winml_recipes.sdk.errors import RecipeError


def test_points_and_box_scale_by_the_resize_per_axis() -> None:
    prompts = default_prompts(
        [Point(60, 40), Point(300, 200, 0)], [Box(10, 20, 310, 220)], (384, 256)
    )
    feeds = prompt_feeds(prompts, (384, 256), (112, 112), static_points=3)
    np.testing.assert_allclose(
        feeds["input_points"][0, 0], [[17.5, 17.5], [87.5, 87.5], [0, 0]], rtol=1e-6
    )
    assert feeds["input_labels"].tolist() == [[[1, 0, -1]]]  # the third is padding
    box = [10 * 112 / 384, 20 * 112 / 256, 310 * 112 / 384, 220 * 112 / 256]
    np.testing.assert_allclose(feeds["input_boxes"], [[box]])
    assert feeds["input_points"].dtype == np.float32 and feeds["input_labels"].dtype == np.int64


def test_the_real_models_frame_scales_the_same_photo_differently() -> None:
    prompts = default_prompts([Point(60, 40)], [], (384, 384))
    tiny = prompt_feeds(prompts, (384, 384), (112, 112), None)["input_points"][0, 0, 0]
    full = prompt_feeds(prompts, (384, 384), (1008, 1008), None)["input_points"][0, 0, 0]
    np.testing.assert_allclose(tiny, [17.5, 40 * 112 / 384])
    np.testing.assert_allclose(full, [157.5, 105.0])


def test_defaults_are_said_and_limits_refused() -> None:
    prompts = default_prompts([], [], (200, 100))
    assert prompts.points == (Point(100, 50, 1),)
    assert prompts.boxes == (Box(0, 0, 200, 100),)
    assert len(prompts.notes) == 2
    with pytest.raises(RecipeError, match="at most 2 points"):
        prompt_feeds(default_prompts([Point(1, 1)] * 3, [], (10, 10)), (10, 10), (10, 10), 2)
    with pytest.raises(RecipeError, match="X,Y"):
        parse_point("1;2")
    with pytest.raises(RecipeError, match="label"):
        parse_point("1,2,5")
    with pytest.raises(RecipeError, match="x1 < x2"):
        parse_box("5,5,1,9")
    assert parse_point("3,4,0") == Point(3, 4, 0)
