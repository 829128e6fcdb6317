"""Reproduction of Streaming DiLoCo Table 4 and Scaling Laws Table 6 (grid indices on logspace(-1, 3, 50))."""

import numpy as np
import pytest

from diloco.sim.paper import (
    CONVENTIONS,
    PAPER_GRID_GBPS,
    PAPER_STEP_TIME_SCALE,
    TABLE4,
    TABLE6,
    format_table,
    grid_index,
    matching_scales,
    reproduce_table4,
    reproduce_table6,
    summarize,
)


def _report(name, cells):
    s = summarize(cells)
    print(f"\n{name}: {s['exact']}/{s['cells']} cells exact, {s['within_one']}/{s['cells']} within one grid step")
    print(format_table(cells))
    for m in s["misses"]:
        print(
            f"  miss: {m['method']} {m['size']} {m['target']:.0%}: paper {m['paper_gbps']} Gbit/s, "
            f"simulated {m['sim_gbps']:.2f} ({m['offset']:+d} grid steps)"
        )
    return s


def test_grid_index_of_known_values():
    assert [grid_index(v) for v in (0.1, 1.4, 86.8, 1000.0)] == [0, 14, 36, 49]
    # Printed values that are no rounding of a grid point, or of two: the nearest in log space.
    assert [grid_index(v) for v in (0.4, 0.9, 1.1)] == [7, 12, 13]
    assert all(grid_index(float(g)) == i for i, g in enumerate(PAPER_GRID_GBPS))


def test_table4_reproduction_with_one_calibration_constant():
    cells = reproduce_table4()
    s = _report(f"Streaming DiLoCo Table 4 (step times x {PAPER_STEP_TIME_SCALE})", cells)
    assert s["cells"] == 75 == sum(len(r) * 5 for r in TABLE4.values())
    assert s["within_one"] == 75
    assert s["exact"] >= 70
    # The misses, pinned so that a change in them is seen: all at the 50 % / 99 % ends of streaming rows.
    assert sorted((m["method"], m["size"], m["target"], m["offset"]) for m in s["misses"]) == [
        ("+ overlap", "100B", 0.5, 1),
        ("+ overlap", "10B", 0.5, -1),
        ("+ overlap + 4-bit", "100B", 0.5, -1),
        ("+ overlap + 4-bit", "1B", 0.5, -1),
        ("Streaming DiLoCo", "100B", 0.99, 1),
    ]


def test_table4_100b_half_utilization_cells_are_inconsistent_with_any_bits_scaling():
    # Why one of the two 100B 50 % overlap cells must miss in a latency-free model: there utilization depends
    # on bits / bandwidth only, so 4 bits at b equals 16 bits at 4b. The paper has 16 bits reaching 50 % at
    # 1.68 Gbit/s but 4 bits not at 0.450 Gbit/s = 16 bits at 1.80 Gbit/s, more than 1.68.
    g16 = PAPER_GRID_GBPS[grid_index(TABLE4["+ overlap"]["100B"][0])]
    g4_below = PAPER_GRID_GBPS[grid_index(TABLE4["+ overlap + 4-bit"]["100B"][0]) - 1]
    assert 4 * g4_below > g16


def test_the_calibration_is_needed_and_is_one_number():
    stated = summarize(reproduce_table4(step_time_scale=1.0))
    assert stated["exact"] <= 10 and stated["within_one"] >= 70  # nearly all one step high without it
    # Data-parallel and DiLoCo (30 cells, no overlap subtleties) all match only in a narrow band around 1.2.
    for scale, all_30 in ((1.18, False), (1.195, True), (1.2, True), (1.2025, True), (1.21, False)):
        cells = [c for c in reproduce_table4(step_time_scale=scale) if c.method in ("Data-Parallel", "DiLoCo")]
        assert all(c.exact for c in cells) == all_30, scale


def test_table6_with_table4_assumptions():
    cells = reproduce_table6()
    s = _report("Scaling Laws Table 6 (10B) with Table 4's assumptions", cells)
    assert (s["cells"], s["exact"], s["within_one"]) == (25, 5, 23)
    assert all(c.offset >= 0 for c in cells)  # the simulator always needs at least the paper's bandwidth


def test_table6_rows_each_need_their_own_step_time_scale():
    scales = np.round(np.arange(1.20, 1.70, 0.01), 2)
    ranges = matching_scales(scales)
    print(
        "\nTable 6: step-time scales at which a row matches all five cells:",
        {r: (v[0], v[-1]) if v else None for r, v in ranges.items()},
    )
    expected = {
        "Data-Parallel": (1.28, 1.39),
        "DiLoCo H=10": (1.31, 1.34),
        "DiLoCo H=50": (1.49, 1.61),
        "DiLoCo H=100": (1.46, 1.50),
        "DiLoCo H=300": (1.38, 1.47),
    }
    for row, (lo, hi) in expected.items():
        assert ranges[row][0] == pytest.approx(lo) and ranges[row][-1] == pytest.approx(hi), row
    assert not set.intersection(*(set(v) for v in ranges.values()))  # no one scale fits every row
    per_row = {row: round((lo + hi) / 2, 3) for row, (lo, hi) in expected.items()}
    assert all(c.exact for c in reproduce_table6(step_time_scale=per_row))


def test_table6_h100_row_is_table4_1b_diloco_row():
    assert TABLE6["DiLoCo H=100"] == TABLE4["DiLoCo"]["1B"]


def test_table4_without_a_fitted_constant_by_reading_the_last_grid_point_below():
    # At the stated step times, reading "the largest grid bandwidth still below the target": 66/75 exact,
    # 75/75 within one grid step, no fitted constant.
    s = _report(
        "Table 4, stated step times, last grid point below",
        reproduce_table4(step_time_scale=1.0, convention="last_below"),
    )
    assert (s["exact"], s["within_one"]) == (66, 75)
    assert CONVENTIONS == ("first_reaching", "last_below")


def test_the_convention_is_a_step_time_factor_of_exactly_one_grid_ratio():
    # Utilization depends on bandwidth x step time only, so a step-time factor equal to the grid's ratio
    # 10^(4/49) = 1.2068 shifts every curve by exactly one grid point: first-reaching at that factor reads
    # the same cells as last-below at the stated times. 1.2 is that shift, nudged (fitted) for 4 more cells.
    ratio = 10 ** (4 / 49)
    a = reproduce_table4(step_time_scale=ratio * (1 + 1e-9))
    b = reproduce_table4(step_time_scale=1.0, convention="last_below")
    assert [c.sim_index for c in a] == [c.sim_index for c in b]
