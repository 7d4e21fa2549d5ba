"""The load test's runner without a run: `make loadtest`'s ports, the PNG's latency axis, the list of reports."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from loadtest.locust import run


def _labels(low: float, high: float) -> list[str]:
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from loadtest.locust.report import label_log_axis

    fig, axis = plt.subplots()
    try:
        axis.plot([0, 1], [low, high])
        axis.set_yscale("log")
        label_log_axis(axis)
        fig.canvas.draw()
        bottom, top = axis.get_ylim()
        return [t.get_text() for t in axis.get_yticklabels() if t.get_text() and bottom <= t.get_position()[1] <= top]
    finally:
        plt.close(fig)


def test_a_latency_axis_of_a_few_decades_is_labelled_at_1_2_and_5() -> None:
    # Over 0.5-40 ms matplotlib's default labels only 1 and 10.
    assert _labels(0.5, 40) == ["0.5", "1", "2", "5", "10", "20"]


def test_a_latency_axis_of_many_decades_is_labelled_at_every_decade() -> None:
    assert _labels(0.5, 20_000) == ["1", "10", "100", "1000", "10000"]


def test_the_reports_list_names_every_file_the_run_left(tmp_path: Path) -> None:
    prefix = tmp_path / "steady"
    made = ["_summary.txt", ".png", ".html", "_stats.csv", "_stats_history.csv", "_extras.json", "_locust.log"]
    for suffix in made:
        Path(f"{prefix}{suffix}").write_text("x")
    (tmp_path / "ramp.png").write_text("another profile's")
    assert run.report_files(prefix) == [Path(f"{prefix}{suffix}") for suffix in made]
    Path(f"{prefix}.png").unlink()  # --no-plot, or no matplotlib: not listed
    assert Path(f"{prefix}.png") not in run.report_files(prefix)


@pytest.mark.parametrize(
    ("variables", "ports"),
    [
        ((), []),  # free ports: never in the way of a `make run`
        (
            ("LISTEN=127.0.0.1:9090", "SIM_LISTEN=127.0.0.1:9091"),
            ["--listen", "127.0.0.1:9090", "--sim-listen", "127.0.0.1:9091"],
        ),
        (("LISTEN=127.0.0.1:9090",), ["--listen", "127.0.0.1:9090"]),
    ],
)
def test_make_loadtest_takes_the_ports_of_make_run(variables: tuple[str, ...], ports: list[str]) -> None:
    make = shutil.which("make")
    if make is None:
        pytest.skip("no make")
    repo = Path(__file__).resolve().parents[2]
    env = {"PATH": "/usr/bin:/bin"}  # no LISTEN from the caller's environment
    for target in ("loadtest", "loadtest-ui"):
        out = subprocess.run([make, "-n", target, *variables], cwd=repo, env=env, capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        argv = out.stdout.strip().splitlines()[-1].split()
        assert argv[1:4] == ["-m", "loadtest.locust.run", "--start-stack"]
        assert [a for i, a in enumerate(argv) if "listen" in a or "listen" in argv[i - 1]] == ports, argv
