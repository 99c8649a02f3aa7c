"""The overview's chart of attempts per minute, as SVG drawn on the server: no chart
library, no script, nothing for the CSP to allow (colours come from the stylesheet)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

from markupsafe import Markup, escape

from durablesched.records import MinuteCounts

WIDTH, HEIGHT = 720, 180
#: Room for the axis labels: left, bottom, top.
LEFT, BOTTOM, TOP = 40, 22, 10
MINUTE = timedelta(minutes=1)


def minutes(now: datetime, count: int) -> list[datetime]:
    """The starts of the ``count`` minutes up to and including ``now``'s, oldest first."""
    last = now.replace(second=0, microsecond=0)
    return [last - MINUTE * (count - 1 - i) for i in range(count)]


def throughput_chart(counts: Sequence[MinuteCounts], now: datetime, span: int = 60) -> Markup:
    """Stacked bars per minute of the last ``span`` minutes: succeeded below, failed above."""
    by_minute = {c.minute: c for c in counts}
    slots = minutes(now, span)
    rows = [by_minute.get(m, MinuteCounts(m, 0, 0)) for m in slots]
    peak = max((r.succeeded + r.failed for r in rows), default=0) or 1
    plot_w, plot_h = WIDTH - LEFT, HEIGHT - BOTTOM - TOP
    step = plot_w / span
    parts = [
        f'<svg class="chart" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" '
        f'aria-label="attempts per minute over the last {span} minutes" '
        'xmlns="http://www.w3.org/2000/svg">',
        f'<line class="axis" x1="{LEFT}" y1="{TOP + plot_h}" x2="{WIDTH}" y2="{TOP + plot_h}"/>',
        f'<text class="label" x="{LEFT - 4}" y="{TOP + 8}" text-anchor="end">{peak}</text>',
        f'<text class="label" x="{LEFT - 4}" y="{TOP + plot_h}" text-anchor="end">0</text>',
    ]
    for i, row in enumerate(rows):
        x = LEFT + i * step
        ok_h = row.succeeded / peak * plot_h
        bad_h = row.failed / peak * plot_h
        tip = escape(f"{row.minute:%H:%M} UTC: {row.succeeded} succeeded, {row.failed} failed")
        parts.append(f"<g><title>{tip}</title>")
        if ok_h:
            y = TOP + plot_h - ok_h
            parts.append(
                f'<rect class="ok" x="{x:.1f}" y="{y:.1f}" width="{step - 1:.1f}" '
                f'height="{ok_h:.1f}"/>'
            )
        if bad_h:
            y = TOP + plot_h - ok_h - bad_h
            parts.append(
                f'<rect class="bad" x="{x:.1f}" y="{y:.1f}" width="{step - 1:.1f}" '
                f'height="{bad_h:.1f}"/>'
            )
        parts.append("</g>")
    for i in (0, span // 2, span - 1):
        label = "now" if i == span - 1 else f"-{span - 1 - i} min"
        x = LEFT + i * step + step / 2
        anchor = "end" if i == span - 1 else "start" if i == 0 else "middle"
        parts.append(
            f'<text class="label" x="{x:.1f}" y="{HEIGHT - 6}" text-anchor="{anchor}">'
            f"{label}</text>"
        )
    parts.append("</svg>")
    return Markup("".join(parts))  # noqa: S704 - numbers and escaped text only
