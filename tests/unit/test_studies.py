"""Each study's committed summaries are what its report computes from its committed records, and its grids file
gives back its grid files as they ran."""

import json

from _close import assert_tree_close

from diloco.studies import STUDIES
from diloco.studies.grid_files import grid_text, read_grids, write_grid_files
from diloco.studies.outer_tuning import GRIDS, PARTS, part_of, records


def test_every_outer_tuning_record_belongs_to_one_part():
    rows = list(records())
    assert len(rows) >= 200 and all(part_of(r) in PARTS for r in rows)
    assert {p: sum(part_of(r) == p for r in rows) for p in PARTS} == {
        "search": 134,
        "long": 54,
        "budget": 13,
        "corpus-check": 1,
    }


def test_the_outer_tuning_grids_come_back_as_files(tmp_path):
    grids = read_grids(GRIDS)
    assert len(grids) == 149
    (path,) = write_grid_files(GRIDS, tmp_path, ["budget-cpu-0.25m-dp-tpp5"])
    assert path.read_text() == grid_text(grids["budget-cpu-0.25m-dp-tpp5"])


def test_the_frontier_summary_is_what_the_records_give(tmp_path, monkeypatch):
    from diloco.studies import frontier_report

    committed = json.loads((STUDIES / "frontier" / "frontier-summary.json").read_text())
    written = {}
    monkeypatch.setattr(frontier_report, "write_json", lambda path, data: written.setdefault(path.name, data))
    monkeypatch.setattr(frontier_report, "_plot", lambda rows: None)
    assert frontier_report.main([]) == 0
    assert_tree_close(json.loads(json.dumps(written["frontier-summary.json"])), committed)
