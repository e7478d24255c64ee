"""Charts as inline SVG, built server-side: pure functions from values to markup.

Every text that comes from the store (task names, worker ids, outcomes) is escaped here, and the
result is :class:`markupsafe.Markup` so templates insert it as is. No script, no external file.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from markupsafe import Markup, escape

from jobguard.models import UNSUCCESSFUL_OUTCOMES, Attempt, Outcome, OutcomeCount

WIDTH = 720
GOOD = frozenset({Outcome.COMPLETED, Outcome.ALREADY_PROCESSED})
BAD = UNSUCCESSFUL_OUTCOMES
COLOURS = {
    Outcome.COMPLETED: "#2e7d32",
    Outcome.ALREADY_PROCESSED: "#66bb6a",
    Outcome.RUNNING: "#1565c0",
    Outcome.RETRY: "#f9a825",
    Outcome.TIMED_OUT: "#ef6c00",
    Outcome.DEFERRED: "#9e9e9e",
    Outcome.RELEASED: "#bdbdbd",
    Outcome.DEAD: "#c62828",
    Outcome.LOST: "#6a1b9a",
    Outcome.LEASE_REFUSED: "#ad1457",
    Outcome.FENCE_REFUSED: "#d84315",
}


def _svg(width: int, height: int, body: list[str], label: str) -> Markup:
    # Safe: every text the builders put in ``body`` went through escape().
    return Markup(  # noqa: S704
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" aria-label="{escape(label)}" '
        f'font-family="sans-serif" font-size="11">{"".join(body)}</svg>'
    )


def _text(x: float, y: float, text: str, anchor: str = "start", fill: str = "#333") -> str:
    return (
        f'<text x="{x:.1f}" y="{y:.1f}" text-anchor="{anchor}" fill="{fill}">{escape(text)}</text>'
    )


def seconds(value: float) -> str:
    """A duration for a label: ``850 ms``, ``2.5 s``, ``3.0 min``."""
    if value < 1:
        return f"{value * 1000:.0f} ms"
    if value < 120:
        return f"{value:.1f} s"
    return f"{value / 60:.1f} min"


def throughput(
    counts: Sequence[OutcomeCount], since: float, bucket_s: float, buckets: int
) -> Markup:
    """Stacked bars per time bucket: completed (green) over failures (red), others grey."""
    height, top, bottom, left = 160, 10, 24, 40
    good = [0] * buckets
    bad = [0] * buckets
    other = [0] * buckets
    for count in counts:
        index = int((count.start - since) // bucket_s)
        if not 0 <= index < buckets:
            continue
        target = good if count.outcome in GOOD else bad if count.outcome in BAD else other
        target[index] += count.count
    peak = max([g + b + o for g, b, o in zip(good, bad, other, strict=True)] + [1])
    plot_h = height - top - bottom
    bar_w = (WIDTH - left - 10) / buckets
    body = [
        f'<line x1="{left}" y1="{height - bottom}" x2="{WIDTH - 10}" y2="{height - bottom}" '
        'stroke="#999"/>',
        _text(left - 4, top + 8, str(peak), "end"),
        _text(left - 4, height - bottom, "0", "end"),
        _text(left, height - 6, f"-{seconds(bucket_s * buckets)}"),
        _text(WIDTH - 10, height - 6, "now", "end"),
    ]
    for index in range(buckets):
        x = left + index * bar_w
        y = float(height - bottom)
        for value, colour, name in (
            (good[index], "#2e7d32", "completed"),
            (bad[index], "#c62828", "failed"),
            (other[index], "#9e9e9e", "other"),
        ):
            if value:
                h = plot_h * value / peak
                y -= h
                body.append(
                    f'<rect x="{x + 1:.1f}" y="{y:.1f}" width="{max(bar_w - 2, 1):.1f}" '
                    f'height="{h:.1f}" fill="{colour}"><title>{value} {name}</title></rect>'
                )
    return _svg(WIDTH, height, body, "attempts per interval: completed and failed")


@dataclass(frozen=True, slots=True)
class Line:
    """A vertical marker on a histogram (a timeout), with its label and colour."""

    at_s: float
    label: str
    colour: str


def histogram(durations: Sequence[float], lines: Sequence[Line], bins: int = 30) -> Markup:
    """Duration histogram with the task's timeouts drawn across it as vertical lines."""
    height, top, bottom, left = 170, 18, 28, 40
    span = max([*durations, *(line.at_s for line in lines), 1e-3]) * 1.08
    counts = [0] * bins
    for value in durations:
        counts[min(bins - 1, int(value / span * bins))] += 1
    peak = max([*counts, 1])
    plot_w = WIDTH - left - 10
    plot_h = height - top - bottom
    bar_w = plot_w / bins
    body = [
        f'<line x1="{left}" y1="{height - bottom}" x2="{WIDTH - 10}" y2="{height - bottom}" '
        'stroke="#999"/>',
        _text(left - 4, top + 8, str(peak), "end"),
        _text(left, height - 8, "0"),
        _text(WIDTH - 10, height - 8, seconds(span), "end"),
    ]
    for index, count in enumerate(counts):
        if count:
            h = plot_h * count / peak
            body.append(
                f'<rect x="{left + index * bar_w + 1:.1f}" y="{height - bottom - h:.1f}" '
                f'width="{max(bar_w - 2, 1):.1f}" height="{h:.1f}" fill="#1565c0">'
                f"<title>{count} runs of {escape(seconds(index * span / bins))} to "
                f"{escape(seconds((index + 1) * span / bins))}</title></rect>"
            )
    for index, line in enumerate(lines):
        x = left + plot_w * line.at_s / span
        body.append(
            f'<line x1="{x:.1f}" y1="{top - 6}" x2="{x:.1f}" y2="{height - bottom}" '
            f'stroke="{line.colour}" stroke-width="2" stroke-dasharray="5,3"/>'
        )
        # Labels step down, so two timeouts at the same value stay readable.
        label = f"{line.label} {seconds(line.at_s)}"
        body.append(_text(x - 3, top + 2 + 13 * index, label, "end", line.colour))
    return _svg(WIDTH, height, body, "handler durations against timeouts")


def _span_of(attempt: Attempt, now: float) -> tuple[float, float]:
    end = attempt.ended_at if attempt.ended_at is not None else now
    if attempt.duration_s is not None:
        end = max(end, attempt.started_at + attempt.duration_s)
    return attempt.started_at, max(end, attempt.started_at)


def _lost_bar(x: float, y: float, w: float, h: float, colour: str, span_s: float) -> list[str]:
    """Only the start of a lost delivery is known: a solid mark there, and an outline up to the
    takeover, when its worker had long stopped reporting (it died or froze somewhere inside)."""
    return [
        f'<rect class="run" x="{x:.1f}" y="{y}" width="2.0" height="{h}" fill="{colour}">'
        "<title>lost: started here</title></rect>",
        f'<rect class="unknown" x="{x:.1f}" y="{y + 0.5}" width="{w:.1f}" height="{h - 1}" '
        f'fill="none" stroke="{colour}" stroke-dasharray="4,3"><title>lost: its worker stopped '
        "reporting (died or froze) somewhere in here; its lease ran out and the job was taken "
        f"over {escape(seconds(span_s))} after the start</title></rect>",
    ]


def timeline(attempts: Sequence[Attempt], now: float) -> Markup:
    """One bar per attempt on a shared time axis, coloured by outcome, labelled by worker."""
    row_h, top, left = 26, 8, 230
    height = top + row_h * max(len(attempts), 1) + 26
    if not attempts:
        return _svg(WIDTH, height, [_text(10, 20, "no attempt yet")], "attempt timeline")
    spans = [_span_of(attempt, now) for attempt in attempts]
    start = min(s for s, _ in spans)
    end = max(e for _, e in spans)
    total = max(end - start, 1e-3)
    plot_w = WIDTH - left - 10
    body: list[str] = []
    for row, (attempt, (s, e)) in enumerate(zip(attempts, spans, strict=True)):
        y = top + row * row_h
        x = left + plot_w * (s - start) / total
        w = max(plot_w * (e - s) / total, 2.0)
        colour = COLOURS.get(attempt.outcome, "#555")
        label = f"#{attempt.attempt} {attempt.worker_id}"[:24]
        body.append(_text(4, y + 15, f"{label} {attempt.outcome.value}"))
        if attempt.never_reported:
            body.extend(_lost_bar(x, y + 3, w, row_h - 8, colour, e - s))
            continue
        body.append(
            f'<rect class="run" x="{x:.1f}" y="{y + 3}" width="{w:.1f}" height="{row_h - 8}" '
            f'fill="{colour}"><title>{escape(attempt.outcome.value)}, '
            f"{escape(seconds(e - s))}</title></rect>"
        )
    axis_y = top + row_h * len(attempts) + 4
    body.append(f'<line x1="{left}" y1="{axis_y}" x2="{WIDTH - 10}" y2="{axis_y}" stroke="#999"/>')
    body.append(_text(left, axis_y + 14, "0"))
    body.append(_text(WIDTH - 10, axis_y + 14, f"+{seconds(total)}", "end"))
    return _svg(WIDTH, height, body, "attempt timeline")


def overlap(first: tuple[str, float, float], second: tuple[str, float, float]) -> Markup:
    """Two runs of one operation on a time axis, the time they overlapped shaded red."""
    height, left = 74, 190
    start = min(first[1], second[1])
    total = max(max(first[2], second[2]) - start, 1e-3)
    plot_w = WIDTH - left - 10

    def x_of(at: float) -> float:
        return left + plot_w * (at - start) / total

    shared_from, shared_to = max(first[1], second[1]), min(first[2], second[2])
    body = []
    if shared_to > shared_from:
        body.append(
            f'<rect x="{x_of(shared_from):.1f}" y="2" '
            f'width="{x_of(shared_to) - x_of(shared_from):.1f}" '
            f'height="52" fill="#ffcdd2"><title>ran at once for '
            f"{escape(seconds(shared_to - shared_from))}</title></rect>"
        )
    for row, (label, s, e) in enumerate((first, second)):
        y = 6 + row * 24
        body.append(_text(4, y + 13, label[:30]))
        body.append(
            f'<rect x="{x_of(s):.1f}" y="{y}" width="{max(x_of(e) - x_of(s), 2):.1f}" '
            f'height="16" fill="{"#1565c0" if row == 0 else "#6a1b9a"}"/>'
        )
    body.append(_text(left, height - 4, "0"))
    body.append(_text(WIDTH - 10, height - 4, f"+{seconds(total)}", "end"))
    return _svg(WIDTH, height, body, "overlapping executions")


def lease_gauge(age_s: float | None, timeout_s: float | None) -> Markup:
    """A small bar: the oldest run's age as a share of the shortest lease (red past it)."""
    width, height = 160, 14
    if age_s is None or not timeout_s:
        return Markup("-")
    share = age_s / timeout_s
    fill = "#c62828" if share >= 1 else "#f9a825" if share >= 0.5 else "#2e7d32"
    w = min(share, 1.0) * width
    body = [
        f'<rect x="0" y="2" width="{width}" height="10" fill="#eee"/>',
        f'<rect x="0" y="2" width="{w:.1f}" height="10" fill="{fill}">'
        f"<title>{escape(seconds(age_s))} of {escape(seconds(timeout_s))}</title></rect>",
    ]
    return _svg(width, height, body, "oldest run against its lease")


def nice_buckets(window_s: float, buckets: int) -> float:
    """The bucket length for ``buckets`` bars over ``window_s`` seconds (whole seconds)."""
    return float(max(1, math.ceil(window_s / buckets)))
