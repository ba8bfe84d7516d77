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
            "--measured", "h200=writeup", "--measured", "rtx5090=writeup",
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
    for extra in (["--measured", "h200=writeup"], ["--measured", f"h200={bench}"]):
        p = run(*common, *extra, cwd=tmp_path)
        assert p.returncode == 0, p.stderr
        doc = json.loads(p.stdout)
        busy.append(doc["runs"]["inference-only"]["utilization"]["overall"]["allocated_busy"])
    assert busy[1] > busy[0] * 1.5
    p = run(*common, "--measured", "a100=x.json", cwd=tmp_path)
    assert p.returncode == 2 and "--measured 'a100=x.json' must be CLASS=FILE" in p.stderr
    assert "Traceback" not in p.stderr


# --- every subcommand: a usage error is one line on stderr and exit 2 -------------------------
def _leaf_commands():
    """(path, click command) of every runnable subcommand of the whole ``ttsfleet`` CLI."""
    import typer.main

    from ttsfleet import cli

    out = []

    def walk(cmd, path):
        subs = getattr(cmd, "commands", None)
        if subs:
            for name, sub in sorted(subs.items()):
                walk(sub, [*path, name])
        else:
            out.append((path, cmd))

    walk(typer.main.get_command(cli.app), [])
    return out


def _type_name(param) -> str:
    """A parameter's value type: click's ``param.type.name`` or, for typer releases whose
    parameters carry no click type, the annotation typer reports."""
    t = getattr(param, "type", None)
    if t is not None:
        return str(getattr(t, "name", type(t).__name__)).lower()
    bare = getattr(param, "bare_type", None)
    return str(bare() if callable(bare) else bare).lower()


def _dummy(param, tmp_path) -> str:
    """A value the parameter accepts, so only the value under test is wrong."""
    name = _type_name(param)
    choices = getattr(getattr(param, "type", None), "choices", None)
    if choices:
        return str(choices[0])
    if "int" in name:
        return "1"
    if "float" in name:
        return "1.0"
    if "path" in name or "file" in name:
        f = tmp_path / "exists.txt"
        f.write_text("x\n")
        return str(f)
    return "x"


def _rejects_garbage(param) -> bool:
    return any(w in _type_name(param) for w in ("int", "float", "choice"))


def _usage_cases(path, cmd, tmp_path):
    """The usage errors to try on one command: unknown option, missing required, bad value."""
    opts = [p for p in cmd.params if p.param_type_name == "option" and not p.is_flag and not p.hidden]
    required = [p for p in cmd.params if p.required]
    yield "unknown option", [*path, "--no-such-option-anywhere"]
    for gone in required:
        yield f"missing {gone.name}", [*path] + [
            tok for p in required if p is not gone for tok in _tokens(p, _dummy(p, tmp_path))]
    for p in opts:
        if _rejects_garbage(p) and p.nargs == 1 and not p.multiple:
            filled = [tok for q in required if q is not p for tok in _tokens(q, _dummy(q, tmp_path))]
            yield f"bad {p.name}", [*path, *filled, *_tokens(p, "not-a-value")]
            break


def _tokens(param, value: str) -> list[str]:
    if param.param_type_name == "argument":
        return [value]
    return [param.opts[0], value]


def test_every_subcommand_reports_usage_errors_in_one_line(tmp_path, capsys):
    """Walks EVERY subcommand of the whole CLI: a missing required option, a value of the wrong
    type and an unknown option each end as one line on stderr, exit code 2, no traceback, and
    the command never runs."""
    from ttsfleet import cli

    leaves = _leaf_commands()
    assert len(leaves) >= 20, [p for p, _ in leaves]
    tried = {}
    for path, cmd in leaves:
        for what, argv in _usage_cases(path, cmd, tmp_path):
            capsys.readouterr()
            rc = cli.main(argv)
            out, err = capsys.readouterr()
            lines = err.strip().splitlines()
            assert rc == 2, (argv, what, rc, err)
            assert len(lines) == 1 and lines[0].startswith("error: ttsfleet "), (argv, what, err)
            assert "Traceback" not in err and out == "", (argv, what, out)
            tried.setdefault(" ".join(path), []).append(what)
    assert set(tried) == {" ".join(p) for p, _ in leaves}
    assert any(w.startswith("missing") for ws in tried.values() for w in ws)
    assert any(w.startswith("bad") for ws in tried.values() for w in ws)
    assert "missing input" in tried["fill run"]


def test_usage_error_from_a_real_process_is_one_line():
    """The case of the issue, through the console entry: typer's vendored click exceptions."""
    p = run("fill", "run", "--output", "/tmp/ttsfleet-never-written")
    assert p.returncode == 2, p.stderr
    assert p.stderr.strip() == ("error: ttsfleet fill run: Missing option '--input' / '-i'. "
                                "(see --help)")


def _fill(manifest, out, ckpt, *extra, env=None):
    import os

    return subprocess.run([sys.executable, "-m", "ttsfleet.cli", "fill", "run", "--input", str(manifest),
                           "--output", str(out), "--checkpoint", str(ckpt), "--stages", "decode,hash",
                           *extra], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **(env or {})})


def _one_line_exit_2(p, needle: str) -> None:
    errors = [line for line in p.stderr.splitlines() if line.startswith("error:")]
    assert p.returncode == 2, p.stderr
    assert len(errors) == 1 and needle in errors[0], p.stderr
    assert "Traceback" not in p.stderr


def test_fill_run_refuses_bad_state_in_one_line(tmp_path):
    """Empty manifest, garbage checkpoint, a checkpoint that counts items the output lacks: each
    one line and exit 2 (before: exit 0 without a word, or a traceback and exit 1)."""
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    _one_line_exit_2(_fill(empty, tmp_path / "o0", tmp_path / "c0"), "has no items")

    manifest = tmp_path / "m.jsonl"  # audio that does not exist: every item is rejected, fast
    manifest.write_text("".join(json.dumps({"audio": f"missing-{i}.wav", "text": "hi", "id": f"u{i}"}) + "\n"
                                for i in range(4)))
    ckpt = tmp_path / "c1"
    ckpt.mkdir()
    (ckpt / "shard-0000-of-0001.json").write_bytes(b"\x00\xff\xfe garbage")
    _one_line_exit_2(_fill(manifest, tmp_path / "o1", ckpt), "is unreadable")
    (ckpt / "shard-0000-of-0001.json").write_text("[1, 2]")
    _one_line_exit_2(_fill(manifest, tmp_path / "o1", ckpt), "not a ttsfleet checkpoint")

    out, ckpt = tmp_path / "o2", tmp_path / "c2"
    killed = _fill(manifest, out, ckpt, "--checkpoint-every-items", "1",
                   env={"TTSFLEET_FILL_FAULT": "after-part:3"})
    assert killed.returncode == -9  # SIGKILLed after its third part, before the checkpoint
    path = ckpt / "shard-0000-of-0001.json"
    doc = json.loads(path.read_text())
    assert doc["items_done"] == 2
    doc["items_done"] = 4  # a checkpoint that claims items the output does not hold
    path.write_text(json.dumps(doc))
    _one_line_exit_2(_fill(manifest, out, ckpt), "missing or duplicated")
