"""The CLI as a user meets it: a real subprocess, real exit codes, one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys


def run(*args: str, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ttsfleet.cli", *args], capture_output=True,
                          text=True, timeout=300, cwd=cwd)


def test_simulate_json(tmp_path):
    p = run("simulate", "--days", "0.25", "--peak-rps", "200", "--fleet", "h200=4,rtx5090=4",
            "--json", "--plot", str(tmp_path / "sim.png"), cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert set(doc["runs"]) == {"static-warm", "inference-only", "policy (inference + fill)"}
    pol = doc["runs"]["policy (inference + fill)"]
    assert pol["utilization"]["overall"]["gpu_busy"] > doc["runs"]["inference-only"][
        "utilization"]["overall"]["gpu_busy"]
    png = (tmp_path / "sim.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000


def test_simulate_table_and_trace_file(tmp_path):
    f = tmp_path / "trace.csv"
    f.write_text("t,rate\n" + "".join(f"{i * 60},{50 + 40 * (i % 10)}\n" for i in range(120)))
    p = run("simulate", "--trace", str(f), "--fleet", "h200=4", "--no-plot", "--quiet")
    assert p.returncode == 0, p.stderr
    assert "GPU-busy (NVML)" in p.stdout and "TTFA p50 / p99" in p.stdout


def test_bad_input_is_one_line_exit_2(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("t,rate\n0,1\n1,oops\n")
    cases = [
        (["simulate", "--fleet", "a100=8", "--no-plot"], "unknown GPU class 'a100'"),
        (["simulate", "--fleet", "h200=-3", "--no-plot"], "must be >= 0"),
        (["simulate", "--trace", str(bad), "--no-plot"], "bad.csv:3: malformed"),
        (["simulate", "--trace", str(tmp_path / "nope.csv"), "--no-plot"], "not found"),
        (["simulate", "--days", "-1", "--no-plot"], "--days must be > 0"),
    ]
    for args, msg in cases:
        p = run(*args)
        assert p.returncode == 2, (args, p.stderr)
        err = p.stderr.strip()
        assert msg in err, (args, err)
        assert len(err.splitlines()) == 1 and "Traceback" not in err


def test_help_lists_components():
    p = run("--help")
    assert p.returncode == 0
    for cmd in ("simulate", "fill", "slurm", "operator", "kernels", "dashboards"):
        assert cmd in p.stdout


def test_exit_codes_of_commands_survive_the_root_wrapper():
    """typer.Exit(n) inside a command must reach the shell as n (not 0)."""
    import typer

    from ttsfleet import cli

    sub = typer.Typer()

    @sub.command()
    def fail() -> None:
        raise typer.Exit(3)

    @sub.command()
    def ok() -> None:
        pass

    cli.app.add_typer(sub, name="selftest")
    try:
        assert cli.main(["selftest", "fail"]) == 3
        assert cli.main(["selftest", "ok"]) == 0
    finally:
        cli.app.registered_groups.pop()


def test_simulate_takes_a_measured_capacity_curve(tmp_path):
    """--measured h200=bench.json replaces the seed curve: a slower GPU keeps more of the fleet busy."""
    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps({"source": "test", "points": [
        {"concurrency": 1, "frames_per_s": 60.0, "ttfa_s": 0.05},
        {"concurrency": 64, "frames_per_s": 1500.0, "ttfa_s": 0.2}]}))
    common = ["simulate", "--days", "0.25", "--peak-rps", "100", "--fleet", "h200=16", "--json", "--no-plot",
              "--quiet"]
    busy = []
    for extra in ([], ["--measured", f"h200={bench}"]):
        p = run(*common, *extra, cwd=tmp_path)
        assert p.returncode == 0, p.stderr
        doc = json.loads(p.stdout)
        busy.append(doc["runs"]["inference-only"]["utilization"]["overall"]["allocated_busy"])
    assert busy[1] > busy[0] * 1.5
    p = run(*common, "--measured", "a100=x.json", cwd=tmp_path)
    assert p.returncode == 2 and "--measured 'a100=x.json' must be CLASS=FILE" in p.stderr
    assert "Traceback" not in p.stderr
