"""The quality-vs-communication plot: methods that send nothing are not put at 10^0 on a log axis."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from diloco.compare import draw_loss_vs_bytes


def test_zero_byte_methods_are_horizontal_lines_and_the_rest_points_on_a_log_axis():
    rows = [
        {"name": "dp", "final_eval_loss": 4.3, "bytes_sent_per_replica": 5.0e9},
        {"name": "diloco", "final_eval_loss": 4.6, "bytes_sent_per_replica": 1.6e8},
        {"name": "diloco-m1", "final_eval_loss": 4.5, "bytes_sent_per_replica": 0},
    ]
    fig, ax = plt.subplots()
    draw_loss_vs_bytes(ax, rows)
    assert ax.get_xscale() == "log"
    points = [tuple(p) for c in ax.collections for p in c.get_offsets()]
    assert sorted(points) == [(1.6e8, 4.6), (5.0e9, 4.3)]  # no point at x <= 1
    assert [tuple(line.get_ydata()) for line in ax.lines] == [(4.5, 4.5)]
    assert any("diloco-m1 (no communication)" == t.get_text() for t in ax.texts)
    plt.close(fig)


def test_only_silent_methods_give_a_linear_axis_without_ticks():
    fig, ax = plt.subplots()
    draw_loss_vs_bytes(ax, [{"name": "m1", "final_eval_loss": 4.5, "bytes_sent_per_replica": 0}])
    assert ax.get_xscale() == "linear" and list(ax.get_xticks()) == []
    assert len(ax.collections) == 0 and len(ax.lines) == 1
    plt.close(fig)
