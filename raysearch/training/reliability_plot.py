"""The reliability diagram as a PNG, drawn with Pillow: cheap enough for every trial of a sweep.

Every trial of a sweep draws its test reliability diagram into its last checkpoint (the tracking
callback attaches it to the trial's MLflow run as ``reliability.png``). Drawn with matplotlib
that cost ~0.5 s per Ray worker (importing matplotlib) and ~70 ms per trial (laying out ticks and
text), about 5% of a sweep of 2-s trials on two cores (``benchmarks/sweep_overhead.py``); drawn
here with Pillow's ``ImageDraw`` it costs a few milliseconds and imports only Pillow (which
matplotlib and torchvision depend on anyway). The figure is the one of the papers (ACLS,
Sec. 4.2 "Reliability diagrams" and Fig. 2, 15 bins; MbLS, Appendix F): per-bin accuracy as bars
against the bin's confidence, the gap to the diagonal of perfect calibration shaded, and the
share of the samples per bin below. Matplotlib figures (the Pareto front,
shift plots) stay in :mod:`raysearch.training.plots`.

Plain NumPy and Pillow: no torch, Ray, MLflow or matplotlib.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFont

__all__ = ["SIZE", "panels", "reliability_diagram"]

#: Final size in pixels (width, height), the size of the matplotlib figure it replaces.
SIZE = (495, 605)
_SCALE = 2  # drawn at twice the size, then reduced: antialiased lines and text
_BLUE, _RED, _GRAY = (31, 119, 180), (214, 39, 40), (150, 150, 150)
_BLACK, _WHITE = (0, 0, 0), (255, 255, 255)


def _font(size: int) -> ImageFont.ImageFont | ImageFont.FreeTypeFont:
    """Pillow's own font at `size` pixels (its bitmap font where FreeType is missing)."""
    try:
        return ImageFont.load_default(size=size)
    except (TypeError, OSError, ImportError):  # Pillow < 10.1 or built without FreeType
        return ImageFont.load_default()


def panels(*, title: bool) -> tuple[tuple[int, int, int, int], tuple[int, int, int, int]]:
    """The two panels' boxes ``(left, top, right, bottom)`` in the PNG's pixels.

    The upper one holds accuracy 1 at its top and 0 at its bottom edge, the lower one the share
    of the samples; both span confidence 0 (left edge) to 1 (right edge).

    Args:
        title: whether the figure has a title (it takes room above the upper panel).

    Returns:
        ``(upper, lower)``, integer pixel boxes of the :data:`SIZE` image.
    """
    width, height = SIZE
    left, right = round(0.15 * width), round(0.97 * width)
    top, bottom = round((0.06 if title else 0.03) * height), round(0.91 * height)
    split = top + round(0.75 * (bottom - top))  # 3:1, the matplotlib figure's height ratios
    return (left, top, right, split - 6), (left, split + 6, right, bottom)


def _blend(color: tuple[int, int, int], under: tuple[int, int, int],
           alpha: float) -> tuple[int, int, int]:
    """`color` at opacity `alpha` over `under` (RGB, 0-255)."""
    return tuple(round(alpha * c + (1 - alpha) * u) for c, u in zip(color, under, strict=True))


def _nice_top(value: float) -> float:
    """The smallest of 0.1, 0.2, 0.25, 0.5, 1.0 (x 10^k) that is >= `value` (> 0)."""
    exponent = math.floor(math.log10(value))
    for step in (1.0, 2.0, 2.5, 5.0, 10.0):
        if step * 10 ** exponent >= value - 1e-12:
            return step * 10 ** exponent
    return 10.0 ** (exponent + 1)


def reliability_diagram(
    edges: Sequence[float],
    counts: Sequence[int],
    accuracy: Sequence[float | None],
    confidence: Sequence[float | None],
    path: str | Path,
    *,
    title: str = "",
) -> Path:
    """Draw a reliability diagram (per-bin accuracy vs. confidence) with a count histogram.

    Top panel: for each non-empty bin, a blue bar of height accuracy over the bin's confidence
    interval, the gap between accuracy and mean confidence shaded red, and the diagonal of
    perfect calibration (dashed). Bottom panel: each bin's share of the samples (gray bars).

    Args:
        edges: bin edges, length ``n_bins + 1``, in [0, 1].
        counts: samples per bin, length ``n_bins``.
        accuracy: accuracy per bin (None or NaN for empty bins), fractions.
        confidence: mean confidence per bin (None or NaN for empty bins), fractions.
        path: output PNG path.
        title: figure title (e.g. the trial name and its ECE).

    Returns:
        The path written (a ``495 x 605`` RGB PNG).

    Raises:
        ValueError: if the lengths disagree (``len(edges) != len(counts) + 1`` or `accuracy`
            or `confidence` not of length ``n_bins``).
    """
    edges_ = np.asarray(edges, dtype=float)
    counts_ = np.asarray(counts, dtype=float)
    acc = np.array([np.nan if a is None else a for a in accuracy], dtype=float)
    conf = np.array([np.nan if c is None else c for c in confidence], dtype=float)
    n = len(counts_)
    if len(edges_) != n + 1 or len(acc) != n or len(conf) != n:
        raise ValueError(f"reliability diagram: {len(edges_)} edges need {len(edges_) - 1} bins, "
                         f"got {n} counts, {len(acc)} accuracies, {len(conf)} confidences")
    s = _SCALE
    width, height = SIZE[0] * s, SIZE[1] * s
    image = Image.new("RGB", (width, height), _WHITE)
    draw = ImageDraw.Draw(image)
    small, medium = _font(10 * s), _font(11 * s)
    upper, lower = (tuple(s * v for v in box) for box in panels(title=bool(title)))
    left, right, top = upper[0], upper[2], upper[1]
    _draw_bins(draw, upper, edges_, counts_, acc, conf, s)
    _draw_diagonal(draw, upper, s)
    span = _draw_shares(draw, lower, edges_, counts_, s)
    _draw_axes(draw, upper, lower, span, small, s)
    draw.text(((left + right) / 2, height - 4 * s), "confidence", fill=_BLACK, font=medium,
              anchor="md")
    for label, box in (("accuracy", upper), ("share", lower)):
        _vertical_text(image, label, medium, (6 * s, (box[1] + box[3]) / 2))
    if title:
        draw.text(((left + right) / 2, top - 6 * s), title, fill=_BLACK, font=medium,
                  anchor="md")
    _legend(draw, small, (upper[0] + 8 * s, upper[1] + 8 * s), s)
    path = Path(path)
    image.reduce(_SCALE).save(path, format="PNG", compress_level=1)
    return path


_Box = tuple[int, int, int, int]


def _x_of(value: float, box: _Box) -> float:
    """The x pixel of `value` in [0, 1] on the horizontal axis of `box`."""
    return box[0] + value * (box[2] - box[0])


def _y_of(value: float, box: _Box, span: float = 1.0) -> float:
    """The y pixel of `value` in [0, span] on the vertical axis of `box`."""
    return box[3] - value / span * (box[3] - box[1])


def _draw_bins(draw: ImageDraw.ImageDraw, upper: _Box, edges: np.ndarray, counts: np.ndarray,
               acc: np.ndarray, conf: np.ndarray, s: int) -> None:
    """The accuracy bars of the non-empty bins, then each bin's gap to its confidence in red."""
    filled = (counts > 0) & np.isfinite(acc)
    for lo, hi, a in zip(edges[:-1][filled], edges[1:][filled], acc[filled], strict=True):
        draw.rectangle((_x_of(lo, upper), _y_of(a, upper), _x_of(hi, upper), upper[3]),
                       fill=_BLUE, outline=_BLACK, width=s)
    gap = filled & np.isfinite(conf)
    for lo, hi, a, c in zip(edges[:-1][gap], edges[1:][gap], acc[gap], conf[gap], strict=True):
        # red at 35% over the bar (a > c: the gap lies inside it) or over white (a < c)
        under = _BLUE if a > c else _WHITE
        box = (_x_of(lo, upper), _y_of(max(a, c), upper), _x_of(hi, upper),
               _y_of(min(a, c), upper))
        draw.rectangle(box, fill=_blend(_RED, under, 0.35), outline=_RED, width=s)


def _draw_diagonal(draw: ImageDraw.ImageDraw, upper: _Box, s: int) -> None:
    """The diagonal of perfect calibration, dashed (20 dashes)."""
    dashes = 40
    for k in range(0, dashes, 2):
        a, b = k / dashes, (k + 1) / dashes
        draw.line((_x_of(a, upper), _y_of(a, upper), _x_of(b, upper), _y_of(b, upper)),
                  fill=_BLACK, width=s)


def _draw_shares(draw: ImageDraw.ImageDraw, lower: _Box, edges: np.ndarray, counts: np.ndarray,
                 s: int) -> float:
    """Each bin's share of the samples as gray bars; returns the top of the share axis."""
    share = counts / max(counts.sum(), 1.0)
    span = _nice_top(float(share.max())) if share.max() > 0 else 1.0
    for lo, hi, v in zip(edges[:-1], edges[1:], share, strict=True):
        if v > 0:
            draw.rectangle((_x_of(lo, lower), _y_of(v, lower, span), _x_of(hi, lower), lower[3]),
                           fill=_GRAY, outline=_BLACK, width=s)
    return span


def _draw_axes(draw: ImageDraw.ImageDraw, upper: _Box, lower: _Box, span: float,
               font: ImageFont.ImageFont, s: int) -> None:
    """The frames of both panels, their ticks and tick labels (share axis up to `span`)."""
    for box in (upper, lower):
        draw.rectangle(box, outline=_BLACK, width=s)
    ticks = [i / 5 for i in range(6)]
    for t in ticks:
        for box in (upper, lower):
            x = _x_of(t, box)
            draw.line((x, box[3], x, box[3] + 4 * s), fill=_BLACK, width=s)
        draw.text((_x_of(t, lower), lower[3] + 6 * s), f"{t:.1f}", fill=_BLACK, font=font,
                  anchor="ma")
        y = _y_of(t, upper)
        draw.line((upper[0] - 4 * s, y, upper[0], y), fill=_BLACK, width=s)
        draw.text((upper[0] - 6 * s, y), f"{t:.1f}", fill=_BLACK, font=font, anchor="rm")
    for t in (0.0, span / 2, span):
        y = _y_of(t, lower, span)
        draw.line((lower[0] - 4 * s, y, lower[0], y), fill=_BLACK, width=s)
        draw.text((lower[0] - 6 * s, y), f"{t:g}", fill=_BLACK, font=font, anchor="rm")


def _vertical_text(image: Image.Image, text: str, font: ImageFont.ImageFont,
                   at: tuple[float, float]) -> None:
    """Write `text` turned 90 degrees counter-clockwise, its box's left middle at `at`."""
    box = font.getbbox(text)
    label = Image.new("L", (box[2] + 2, box[3] + 2), 0)
    ImageDraw.Draw(label).text((1, 1), text, fill=255, font=font)
    turned = label.rotate(90, expand=True)
    x, y = int(at[0]), int(at[1] - turned.height / 2)
    image.paste(Image.new("RGB", turned.size, _BLACK), (x, y), turned)


def _legend(draw: ImageDraw.ImageDraw, font: ImageFont.ImageFont, at: tuple[int, int],
            s: int) -> None:
    """The three entries (accuracy, gap, perfect calibration) in a framed box at `at`."""
    x, y = at
    row, key = 16 * s, 22 * s
    entries = ("accuracy", "gap", "perfect calibration")
    text_width = max(int(draw.textlength(e, font=font)) for e in entries)
    draw.rectangle((x, y, x + key + text_width + 14 * s, y + row * 3 + 8 * s), fill=_WHITE,
                   outline=(200, 200, 200), width=s)
    for i, label in enumerate(entries):
        top = y + 4 * s + i * row
        middle = top + row / 2
        swatch = (x + 5 * s, top + 3 * s, x + key, top + row - 3 * s)
        if label == "accuracy":
            draw.rectangle(swatch, fill=_BLUE, outline=_BLACK, width=s)
        elif label == "gap":
            draw.rectangle(swatch, fill=_blend(_RED, _WHITE, 0.35), outline=_RED, width=s)
        else:
            draw.line((swatch[0], middle, swatch[0] + 6 * s, middle), fill=_BLACK, width=s)
            draw.line((swatch[2] - 6 * s, middle, swatch[2], middle), fill=_BLACK, width=s)
        draw.text((x + key + 6 * s, middle), label, fill=_BLACK, font=font, anchor="lm")
