"""Issue 44's mixing case among the peers (``benchmarks/peers/run.py --mix-case``), without any peer's environment:
the verdicts on made-up rows (``mix_case.py``), the options, the table and the page's section from a small results
dict, and one real run of zarrtorch's mix merged into the committed JSON and page."""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path

import pytest

from zarrtorch.course import peers_table

PEERS = Path(__file__).resolve().parents[2] / "benchmarks" / "peers"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"peers_{name}", PEERS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there (mix_case.py's MixCtx)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def run_py():
    """``benchmarks/peers/run.py`` (it puts benchmarks/peers/ on ``sys.path``, taken off again afterwards)."""
    saved = list(sys.path)
    try:
        yield _load("run")
    finally:
        sys.path[:] = saved


@pytest.fixture(scope="module")
def mix_case(run_py):
    return sys.modules.get("mix_case") or _load("mix_case")


def _ids(source: int, rows) -> list[int]:
    return [source * 1_000_000 + r for r in rows]


def test_per_source_batches_on_target_every_row_once_are_all_yes(mix_case):
    """Two stores of 8 and 4 rows, targets 8 and 8 (the second store twice over), batch 4 on 2 ranks: both ranks
    draw the same source at each step, every row of the first once, of the second twice, another order in epoch 2."""
    epoch1 = [[_ids(0, range(0, 4)), _ids(1, [0, 1, 2, 3])], [_ids(0, range(4, 8)), _ids(1, [3, 2, 1, 0])]]
    epoch2 = [[_ids(1, [3, 2, 1, 0]), _ids(0, range(7, 3, -1))], [_ids(1, [0, 1, 2, 3]), _ids(0, range(4))]]
    said = mix_case.mix_verdicts([epoch1, epoch2], [8, 4], [8, 8], 4)
    assert said["rows_per_source"] == "8 + 8; 8 + 8 (8 + 8)"
    assert (said["on_target"], said["quota_once"], said["two_epochs_once"]) == ("yes", "yes", "yes")
    assert (said["same_source_per_step"], said["equal_batches"], said["epoch2_order"]) == ("yes", "yes", "other")
    assert said["homogeneous_batches"] == "4/4, 4/4" and said["foreign_rows"] == 0
    assert said["every_rank_every_source"] == "yes"


def test_mixed_batches_other_sources_per_rank_and_rows_drawn_unevenly_are_said(mix_case):
    """A batch of both stores; ranks drawing other stores at a step; a store of 8 rows drawn 8 times with one row
    twice and one never; the same rows in epoch 2 as a fresh shuffle of a store asked for half its rows draws
    them; off target by more than a global batch (8 rows)."""
    mixed = [[_ids(0, [0, 1]) + _ids(1, [0, 1])], [_ids(0, [2, 3]) + _ids(1, [2, 3])]]
    said = mix_case.mix_verdicts([mixed, mixed], [4, 4], [4, 4], 4)
    assert said["same_source_per_step"] == "no: mixed batches" and said["homogeneous_batches"] == "0/2, 0/2"
    assert said["epoch2_order"] == "same"
    apart = [[_ids(0, range(4)), _ids(0, [4, 5, 6, 6])], [_ids(1, range(4)), _ids(1, range(4))]]
    said = mix_case.mix_verdicts([apart, apart], [8, 4], [8, 8], 4)
    assert said["same_source_per_step"] == "no: 2 and 2 steps differ"
    assert (
        said["every_rank_every_source"]
        == "no: rank 0 none of source 1 (epoch 1, 2); rank 1 none of source 0 (epoch 1, 2)"
    )
    assert said["quota_once"] == "no: source 0: 2 draws over, 2 rows under"  # row 6 twice, row 7 never, per epoch
    half = [[_ids(0, range(4))], [_ids(0, range(4, 8))]]  # 8 of 16 rows, the same 8 each epoch
    said = mix_case.mix_verdicts([half, half], [16], [8], 4)
    assert said["quota_once"] == "yes" and said["two_epochs_once"] == "no: source 0: 8 draws over, 8 rows under"
    said = mix_case.mix_verdicts([half, half], [16], [20], 4)
    assert said["on_target"] == "no: 2 of 2 off by more than a global batch"


def test_the_mix_options_are_parsed_and_wrong_weights_refused_with_an_example(run_py):
    run = run_py
    a = run.parse_args([])
    assert (a.mix_case, a.mix_rows, a.mix_epoch_rows, a.mix_world) == ("yes", [1024, 512], 1536, 2)
    assert a.mix_weights == [[0.7, 0.3], [0.3, 0.7], [0.5, 0.5]]
    a = run.parse_args(["--mix-case", "only", "--mix-weights", "1,1,2", "--mix-rows", "64,32,16"])
    assert (a.mix_case, a.mix_weights, a.mix_rows) == ("only", [[1.0, 1.0, 2.0]], [64, 32, 16])
    for wrong in ("0.7,0.3;1", "0,0", "-1,2", ";"):
        with pytest.raises(argparse.ArgumentTypeError, match="e.g. 0.7,0.3;0.3,0.7"):
            run.mix_weights(wrong)
    with pytest.raises(SystemExit):
        run.parse_args(["--mix-case", "maybe"])


def _case() -> dict:
    """A made-up mixing case: one loader with two variants (one refused), one that could not be installed."""
    yes = {"on_target": "yes", "quota_once": "yes", "two_epochs_once": "yes", "same_source_per_step": "yes"}
    yes |= {"every_rank_every_source": "yes"}
    yes |= {"rows_per_source": "16 + 8; 16 + 8 (16 + 8)", "homogeneous_batches": "6/6, 6/6"}
    yes |= {"equal_batches": "yes", "epoch2_order": "other", "rows_per_s": 1234.5}
    mixed = yes | {"same_source_per_step": "no: mixed batches", "two_epochs_once": "no: source 0: 3 draws over"}
    mixed |= {"every_rank_every_source": "no: rank 0 none of source 1 (epoch 1)", "equal_batches": "wrong: 6 vs 5"}
    variants = {"per stream": yes, "mixed": mixed, "refusing": {"error": "ValueError: no"}}
    return {
        "settings": {"rows": [16, 8], "epoch_rows": 24, "world": 2, "workers": 0, "batch_size": 4},
        "date": "2026-01-01T00:00",
        "wall_s": 12.0,
        "load_average": [3.0, 2.5],
        "runs": [
            {"name": "Lib", "status": "ok", "weights": [0.7, 0.3], "mix": {"variants": variants}},
            {"name": "Lib", "status": "ok", "weights": [0.3, 0.7], "mix": {"variants": {"per stream": yes}}},
            {"name": "Gone", "status": "not installable", "reason": "needs CUDA", "weights": [0.7, 0.3]},
        ],
    }


def test_the_mix_table_and_page_section_render_from_a_small_results_dict():
    case = _case()
    case["settings"]["weights"] = [[0.7, 0.3], [0.3, 0.7]]
    table = peers_table.table_module().mix_markdown(case)
    lines = table.splitlines()
    assert len(lines) == 2 + 5 and all(line.count("|") == lines[0].count("|") for line in lines)
    assert "| Lib | 0.7/0.3 | per stream | 16 + 8; 16 + 8 (16 + 8) | yes |" in table and "| 1,234 |" in table
    assert "| Lib | 0.7/0.3 | refusing | refused: ValueError: no |" in table
    assert "| Gone | 0.7/0.3 |  | not run: needs CUDA |" in table
    section = peers_table._page_mix({"mix_case": case})
    assert section.startswith("## Several stores mixed by weight") and "[mix.md](mix.md)" in section
    text = " ".join(section.split())
    assert "drawing the same source at each step (a head per source under DDP needs both): Lib (per stream)." in text
    assert "goes on where it stopped): Lib (per stream)." in text and table in section
    assert "draws no row of a store asked for, in some setting: Lib (mixed)." in text
    assert "waits at the longer rank's next collective): Lib (mixed)." in text
    assert peers_table._page_mix({}) == ""


def test_benchmarks_peers_md_keeps_the_mix_section_after_the_other_parts(run_py):
    """``benchmarks/peers.md``: the mixing case's section follows the others (the ``--uneven``, ``--layouts`` and
    ``--workers-case`` ``only`` runs rewrite what follows their part and put it back), with its load average."""
    case = _case()
    section = run_py.mix_section({"mix_case": case})
    assert section.startswith(f"\n\n{run_py.MIX_HEADING}\n\nStores of 16 and 8 rows, 24 rows per epoch")
    assert "load average 3.0 then 2.5." in section
    workers = {"settings": {"batch_size": 4, "counts": [0, 2], "start_method": "fork"}, "peers": []}
    workers |= {"date": "2026-01-01T00:00", "wall_s": 1.0}
    tail = run_py.tail_sections({"mix_case": case, "workers_case": workers})
    assert tail.index(run_py.WORKERS_HEADING) < tail.index(run_py.MIX_HEADING) and tail.endswith(section)


def test_the_mix_case_runs_zarrtorch_for_real_and_merges_into_the_page(tmp_path, monkeypatch, run_py):
    """``--mix-case only --only zarrtorch`` on stores of 64 and 32 rows (chunks of 16, batch 4, 2 simulated ranks):
    zarrtorch's MixedLoader gives per-source batches, the same source on both ranks at each step, every
    target within a global batch; the case is merged into the committed JSON and page, keeping the rest."""
    run = run_py
    committed = {"peers": [{"name": "timed"}], "date": "2026-01-01T00:00"}
    (tmp_path / "peers.json").write_text(json.dumps(committed))
    (tmp_path / "peers.md").write_text(f"# the main table\n\n| timed |\n\n{run.MIX_HEADING}\n\nold\n")
    argv = ["run.py", "--mix-case", "only", "--only", "zarrtorch", "--mix-rows", "64,32", "--mix-epoch-rows", "96"]
    argv += ["--mix-weights", "0.3,0.7", "--chunk-rows", "16", "--batch-size", "4", "--mix-data-dir", str(tmp_path)]
    argv += ["--md", str(tmp_path / "peers.md"), "--out", str(tmp_path / "out" / "peers.json")]
    monkeypatch.setattr(sys, "argv", argv)
    run.main()
    results = json.loads((tmp_path / "peers.json").read_text())
    assert results["peers"] == committed["peers"]
    [zarrtorch] = results["mix_case"]["runs"]
    said = zarrtorch["mix"]["variants"]["weights"]
    assert (said["on_target"], said["same_source_per_step"], said["equal_batches"]) == ("yes", "yes", "yes")
    assert said["foreign_rows"] == 0 and said["two_epochs_once"] == "yes" and said["every_rank_every_source"] == "yes"
    page = (tmp_path / "peers.md").read_text()
    assert page.startswith("# the main table\n\n| timed |\n\n") and "old" not in page
    assert "| zarrtorch | 0.3/0.7 | weights |" in page
