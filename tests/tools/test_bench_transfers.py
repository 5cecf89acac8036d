"""The bench's transfer table: the package's upload, download and round trip beside bare wgpu."""

import json

from generated import bench, bench_transfers


def test_transfer_rows_time_each_direction_and_check_the_values(device):
    timer = bench.GpuTimer(device, batch=1, use_timestamps=False)
    (row,) = bench_transfers.transfer_rows(device, timer.sync, sizes_mb=(1,), reps=2)
    assert row["megabytes"] == 1
    for kind in ("upload", "download", "round_trip"):
        assert row[f"{kind}_ms"] > 0 and row[f"{kind}_floor_ms"] > 0
    table = bench_transfers.transfers_markdown([row])
    assert table[-1].startswith("| 1 | ") and table[-1].count("|") == 11


def test_bench_transfers_only_prints_the_table_and_writes_it_to_json(tmp_path, capsys):
    path = tmp_path / "bench.json"
    assert bench.main(["--quick", "--transfers", "only", "--json", str(path)]) == 0
    printed = capsys.readouterr().out
    assert "| MB | upload | floor |" in printed
    assert "| op | case |" not in printed  # no op cases ran
    rows = json.loads(path.read_text())["transfers"]
    assert [row["megabytes"] for row in rows] == list(bench_transfers.QUICK_SIZES_MB)
