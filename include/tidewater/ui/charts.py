"""Line charts as inline SVG, drawn on the server: no chart library, no script, nothing fetched.

The pages run inside the Airflow UI on closed networks, so a plot is markup like the rest of the page:
:func:`line_chart` turns series of ``(unix seconds, value)`` points into one ``<svg>`` with axes, ticks,
a legend and a ``<title>`` per point (the browser shows it on hover). Every text that came from data
(series names, units) is escaped here. Pure: unit-tested without a server.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Mapping, Sequence
from html import escape

# Colour-blind-safe (Okabe-Ito), one per series in order.
PALETTE = ("#0072b2", "#e69f00", "#009e73", "#cc79a7", "#56b4e9", "#d55e00", "#f0e442", "#000000")
WIDTH, HEIGHT = 560, 200
LEFT, RIGHT, TOP, BOTTOM = 56, 12, 24, 40  # the plot area's margins (axis labels, legend)

Point = tuple[float, float]


def nice_ceiling(value: float) -> float:
    """The smallest of 1, 2, 2.5, 5 x 10^n at or above ``value`` (an axis maximum people read easily)."""
    if value <= 0 or not math.isfinite(value):
        return 1.0
    exponent = math.floor(math.log10(value))
    for step in (1.0, 2.0, 2.5, 5.0, 10.0):
        candidate = step * 10**exponent
        if candidate >= value * (1 - 1e-9):
            return candidate
    return 10.0 ** (exponent + 1)


def short_number(value: float) -> str:
    """1234 -> ``1.2k``, 2500000 -> ``2.5M``, 0.25 -> ``0.25``: tick labels that fit."""
    size = abs(value)
    for limit, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if size >= limit:
            return f"{value / limit:.3g}{suffix}"
    return f"{value:.3g}"


def line_chart(
    title: str,
    series: Mapping[str, Sequence[Point]],
    *,
    unit: str = "",
    chart_id: str = "",
    width: int = WIDTH,
    height: int = HEIGHT,
) -> str:
    """An SVG line chart of ``series`` (name -> points, any order) against time (UTC).

    Empty series are left out of the legend; with no point at all the chart says so instead of
    drawing empty axes."""
    drawn = {name: sorted(points) for name, points in series.items() if points}
    attrs = f'class="chart" role="img" width="{width}" height="{height}" viewBox="0 0 {width} {height}"'
    if chart_id:
        attrs += f' id="{escape(chart_id)}"'
    label = escape(title + (f" ({unit})" if unit else ""))
    parts = [f'<svg {attrs} aria-label="{label}"><title>{label}</title>']
    parts.append(f'<text x="{LEFT}" y="15" font-size="12" font-weight="600">{label}</text>')
    if not drawn:
        parts.append(f'<text x="{width / 2}" y="{height / 2}" text-anchor="middle" fill="#7b8794" font-size="12">')
        parts.append("no data yet</text></svg>")
        return "".join(parts)
    times = [t for points in drawn.values() for t, _ in points]
    values = [v for points in drawn.values() for _, v in points]
    t0, t1 = min(times), max(times)
    if t1 - t0 < 1:
        t0, t1 = t0 - 30, t1 + 30  # one moment: a minute around it
    low = min(0.0, min(values))
    high = nice_ceiling(max(values)) if max(values) > 0 else 1.0
    plot_w, plot_h = width - LEFT - RIGHT, height - TOP - BOTTOM

    def x(t: float) -> float:
        return LEFT + (t - t0) / (t1 - t0) * plot_w

    def y(v: float) -> float:
        return TOP + plot_h - (v - low) / (high - low) * plot_h

    # Axes, horizontal grid lines with value ticks, time ticks.
    parts.append(
        f'<g stroke="#d9e2ec" font-size="10" fill="#52606d">'
        f'<line x1="{LEFT}" y1="{TOP + plot_h}" x2="{LEFT + plot_w}" y2="{TOP + plot_h}" stroke="#9aa5b1"/>'
    )
    for i in range(5):
        v = low + (high - low) * i / 4
        parts.append(
            f'<line x1="{LEFT}" y1="{y(v):.1f}" x2="{LEFT + plot_w}" y2="{y(v):.1f}"/>'
            f'<text x="{LEFT - 4}" y="{y(v) + 3:.1f}" text-anchor="end" stroke="none">{escape(short_number(v))}</text>'
        )
    span = t1 - t0
    for i in range(4):
        t = t0 + span * i / 3
        stamp = dt.datetime.fromtimestamp(t, dt.UTC)
        text = stamp.strftime("%H:%M:%S" if span < 600 else "%H:%M" if span < 86400 else "%m-%d %H:%M")
        anchor = "start" if i == 0 else "end" if i == 3 else "middle"
        parts.append(f'<text x="{x(t):.1f}" y="{TOP + plot_h + 14}" text-anchor="{anchor}" stroke="none">{text}</text>')
    parts.append("</g>")
    # The lines, a dot with its value per point, and the legend.
    legend_x = LEFT
    for index, (name, points) in enumerate(drawn.items()):
        colour = PALETTE[index % len(PALETTE)]
        path = " ".join(f"{x(t):.1f},{y(v):.1f}" for t, v in points)
        parts.append(
            f'<g class="series" data-series="{escape(name)}" data-points="{len(points)}">'
            f'<polyline fill="none" stroke="{colour}" stroke-width="1.6" points="{path}"/>'
        )
        for t, v in points:
            when = dt.datetime.fromtimestamp(t, dt.UTC).strftime("%Y-%m-%d %H:%M:%S")
            tip = escape(f"{name}: {v:,.6g}{' ' + unit if unit else ''} at {when} UTC")
            parts.append(f'<circle cx="{x(t):.1f}" cy="{y(v):.1f}" r="2" fill="{colour}"><title>{tip}</title></circle>')
        parts.append("</g>")
        legend_y = height - 8
        parts.append(
            f'<rect x="{legend_x}" y="{legend_y - 8}" width="10" height="3" fill="{colour}"/>'
            f'<text x="{legend_x + 14}" y="{legend_y - 4}" font-size="10">{escape(name)}</text>'
        )
        legend_x += 24 + 6 * len(name)
    parts.append("</svg>")
    return "".join(parts)
