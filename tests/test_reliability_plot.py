"""The Pillow reliability diagram: bars where the bins say, in the colours the legend says."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from raysearch.training.reliability_plot import SIZE, panels, reliability_diagram

EDGES = np.linspace(0.0, 1.0, 11)  # ten bins of width 0.1
#           bin:    0     1     2    3    4     5    6    7     8     9
COUNTS = [0, 0, 0, 10, 30, 60, 0, 100, 200, 600]
ACCURACY = [None, None, None, 0.2, 0.3, 0.8, None, 0.7, 0.8, 0.95]
CONFIDENCE = [None, None, None, 0.35, 0.55, 0.6, None, 0.75, 0.85, 0.97]


def _pixel(image: Image.Image, box: tuple[int, ...], x: float, y: float) -> tuple[int, ...]:
    """The colour at confidence `x`, height `y` (a fraction of the panel) of `box`."""
    left, top, right, bottom = box
    return image.getpixel((round(left + x * (right - left)), round(bottom - y * (bottom - top))))


def _close(color: tuple[int, ...], expected: tuple[int, int, int], tol: int = 12) -> bool:
    return all(abs(c - e) <= tol for c, e in zip(color[:3], expected, strict=True))


BLUE, WHITE, GRAY = (31, 119, 180), (255, 255, 255), (150, 150, 150)
RED_ON_WHITE = tuple(round(0.35 * r + 0.65 * w) for r, w in zip((214, 39, 40), WHITE, strict=True))
RED_ON_BLUE = tuple(round(0.35 * r + 0.65 * b) for r, b in zip((214, 39, 40), BLUE, strict=True))


@pytest.fixture(scope="module")
def diagram(tmp_path_factory):
    path = tmp_path_factory.mktemp("plot") / "reliability.png"
    assert reliability_diagram(EDGES, COUNTS, ACCURACY, CONFIDENCE, path,
                               title="t-001  test ECE 5.00%") == path
    return Image.open(path).convert("RGB")


def test_size_and_format(diagram):
    assert diagram.size == SIZE


def test_accuracy_bars_reach_each_bins_accuracy(diagram):
    upper, _ = panels(title=True)
    # bin 4 (0.4-0.5): accuracy 0.3, confidence 0.55 -> blue up to 0.3, red gap 0.3-0.55
    assert _close(_pixel(diagram, upper, 0.45, 0.15), BLUE)
    assert _close(_pixel(diagram, upper, 0.45, 0.27), BLUE)
    assert _close(_pixel(diagram, upper, 0.45, 0.33), RED_ON_WHITE)
    assert _close(_pixel(diagram, upper, 0.45, 0.52), RED_ON_WHITE)
    assert _close(_pixel(diagram, upper, 0.45, 0.60), WHITE)
    # bin 5: accuracy 0.8 over confidence 0.6 -> the gap lies inside the bar
    assert _close(_pixel(diagram, upper, 0.55, 0.40), BLUE)
    assert _close(_pixel(diagram, upper, 0.55, 0.70), RED_ON_BLUE)
    assert _close(_pixel(diagram, upper, 0.55, 0.85), WHITE)


def test_empty_bins_have_no_bar(diagram):
    upper, lower = panels(title=True)
    for x in (0.05, 0.15, 0.65):  # bins 0, 1 and 6 hold no sample
        assert _close(_pixel(diagram, upper, x, 0.03), WHITE)
        assert _close(_pixel(diagram, lower, x, 0.03), WHITE)


def test_share_panel_scales_to_a_round_top(diagram):
    _, lower = panels(title=True)
    # bin 9 holds 600 / 1000 = 0.6 of the samples; the panel's top is 1.0 (0.5 < 0.6)
    assert _close(_pixel(diagram, lower, 0.95, 0.55), GRAY)
    assert _close(_pixel(diagram, lower, 0.95, 0.66), WHITE)
    # bin 3: 0.01 -> a sliver at the bottom only
    assert _close(_pixel(diagram, lower, 0.35, 0.2), WHITE)


def test_lengths_that_disagree_are_refused(tmp_path):
    with pytest.raises(ValueError, match="11 edges need 10 bins, got 9 counts"):
        reliability_diagram(EDGES, COUNTS[:9], ACCURACY[:9], CONFIDENCE[:9], tmp_path / "x.png")


def test_no_matplotlib_is_imported():
    code = ("import sys\nfrom raysearch.training.reliability_plot import reliability_diagram\n"
            "reliability_diagram([0, .5, 1], [1, 1], [0, 1], [.25, .75], sys.argv[1])\n"
            "print('matplotlib' in sys.modules, 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code, "/dev/null"], capture_output=True,
                         text=True, check=True).stdout.split()
    assert out == ["False", "False"]
