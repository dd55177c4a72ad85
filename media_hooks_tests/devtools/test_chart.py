"""The demo's chart (media_hooks.devtools.chart): a 429's pause is shaded where it happened."""

from __future__ import annotations

from matplotlib.pyplot import close

from media_hooks.devtools.chart import PAUSE_GID, PAUSE_LABEL, Limit, draw_request_rates


def _shaded(ax) -> list[tuple[float, float]]:
    """The pauses shaded on ``ax``, as (from, to) on its x axis."""
    spans = []
    for patch in ax.patches:
        if patch.get_gid() == PAUSE_GID:
            # A rectangle, or before matplotlib 3.9 a polygon: its corners either way.
            xs = [x for x, _ in patch.get_path().transformed(patch.get_patch_transform()).vertices]
            spans.append((round(min(xs), 2), round(max(xs), 2)))
    return sorted(spans)


def _legend(ax) -> list[str]:
    return [text.get_text() for text in ax.get_legend().get_texts()]


def test_a_pause_is_shaded_on_both_plots_of_its_destination_only():
    starts = {"partner": {0: 10, 1: 2, 3: 10}, "cdn": {0: 20, 1: 20, 2: 20, 3: 20}}
    limits = {"partner": Limit(10, 2), "cdn": Limit(20, 2)}
    figure = draw_request_rates(starts, limits, pauses={"partner": [(1.4, 2.4)]})
    try:
        # One row per destination, the highest rate first: bars, then the running total.
        cdn_bars, cdn_total, partner_bars, partner_total = figure.axes
        # The bar of second s is centred on s: a pause from 1.4 s stands from 0.9 there.
        assert _shaded(partner_bars) == [(0.9, 1.9)]
        assert _shaded(partner_total) == [(1.4, 2.4)]
        assert _shaded(cdn_bars) == [] and _shaded(cdn_total) == []
        assert PAUSE_LABEL in _legend(partner_bars) and PAUSE_LABEL in _legend(partner_total)
        assert PAUSE_LABEL not in _legend(cdn_bars)
    finally:
        close(figure)
