"""The shipped fill/train config fragment and the slurm.conf validator (no daemons needed)."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
from ttsfleet.slurm.conf import expand_hostlist, parse_conf, render_fill_conf
from ttsfleet.slurm.validate import check_conf, validate_file

from ttsfleet.catalog import GpuCatalog
from ttsfleet.cli import main

CAT = GpuCatalog.default()

pytestmark = pytest.mark.slurm

NODES = "NodeName=gpu[01-02] CPUs=64 RealMemory=512000 Gres=gpu:h200:8\n"


def site_conf(**replace: str) -> str:
    """A site's slurm.conf built from the shipped fragment, with lines replaced by key."""
    text = "ClusterName=site\nSlurmctldHost=head\n" + NODES + render_fill_conf(
        nodes="gpu[01-02]", grace_period_s=60, cred_expire_s=30)
    for key, line in replace.items():
        pattern = rf"^{key}=.*$" if not key.startswith("PartitionName") else rf"^{key} .*$"
        text, n = re.subn(pattern, line, text, flags=re.M)
        assert n == 1, f"{key} not in the fragment"
    return text


def errors(text: str) -> list[str]:
    return [f.message for f in check_conf(parse_conf(text), CAT) if f.severity == "error"]


def test_rendered_fragment_is_clean_and_documented() -> None:
    text = site_conf()
    findings = check_conf(parse_conf(text), CAT)
    assert findings == []
    # every setting line of the fragment has a comment right above it (documented line by line)
    lines = render_fill_conf(nodes="n1").splitlines()
    for i, line in enumerate(lines):
        if line and not line.startswith("#"):
            assert lines[i - 1].startswith("#"), f"undocumented line: {line}"


@pytest.mark.parametrize(("key", "line", "expect"), [
    ("RequeueExit", "RequeueExit=1", "RequeueExit must include 99"),
    ("SlurmctldParameters", "SlurmctldParameters=enable_configless", "preempt_send_user_signal"),
    ("PreemptType", "PreemptType=preempt/qos", "preempt/partition_prio"),
    ("GresTypes", "GresTypes=license", "GresTypes must include gpu"),
    ("PartitionName=fill", "PartitionName=fill Nodes=gpu[01-02] PriorityTier=1 PreemptMode=CANCEL",
     "GraceTime must be > 0"),
    ("PartitionName=train", "PartitionName=train Nodes=gpu01 PriorityTier=1 PreemptMode=OFF",
     "is not above fill's 1"),
])
def test_each_trap_is_an_error(key: str, line: str, expect: str) -> None:
    found = errors(site_conf(**{key: line}))
    assert any(expect in m for m in found), found


def test_fill_partition_must_requeue() -> None:
    text = site_conf(**{"PartitionName=fill": "PartitionName=fill Nodes=gpu[01-02] PriorityTier=1 "
                                              "PreemptMode=SUSPEND GraceTime=30"})
    assert any("PreemptMode must be REQUEUE" in m for m in errors(text))


def test_default_cred_expire_is_a_warning_with_the_fix() -> None:
    text = site_conf(AuthInfo="AuthInfo=socket=/run/munge/munge.socket.2")
    findings = check_conf(parse_conf(text), CAT)
    assert [f.severity for f in findings] == ["warning"]
    assert "cred_expire=120 s" in findings[0].message and "cred_expire=30" in findings[0].message


def test_requeue_exit_hold_and_untyped_gpus() -> None:
    text = site_conf(RequeueExit="RequeueExit=99\nRequeueExitHold=90-100")
    text = text.replace("Gres=gpu:h200:8", "Gres=gpu:8")
    found = errors(text)
    assert any("RequeueExitHold" in m for m in found)
    assert any("untyped GPUs" in m for m in found)


def test_malformed_file_names_the_line(tmp_path: Path) -> None:
    p = tmp_path / "slurm.conf"
    p.write_text("ClusterName=x\nPreemptType=preempt/partition_prio\nthis is not slurm\n")
    (f,) = validate_file(str(p), CAT)
    assert (f.severity, f.line) == ("error", 3)
    assert "Key=Value" in f.message


def test_cli_exit_codes_and_findings(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good, bad = tmp_path / "good.conf", tmp_path / "bad.conf"
    good.write_text(site_conf())
    bad.write_text(site_conf(RequeueExit="RequeueExit=1"))
    assert main(["slurm", "validate-conf", str(good)]) == 0
    assert "ok for fill work" in capsys.readouterr().out
    assert main(["slurm", "validate-conf", str(bad)]) == 2
    err = capsys.readouterr().err
    assert f"{bad}:" in err and "RequeueExit must include 99" in err
    assert "Traceback" not in err
    assert main(["slurm", "validate-conf", str(tmp_path / "missing.conf")]) == 2
    assert "cannot read" in capsys.readouterr().err


def test_hostlists() -> None:
    assert expand_hostlist("gpu[01-03,7],cpu-a") == ["gpu01", "gpu02", "gpu03", "gpu7", "cpu-a"]
    assert expand_hostlist("n[1-2]x") == ["n1x", "n2x"]


def _sinfo(conf: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["sinfo", "-h"], env={**os.environ, "SLURM_CONF": str(conf)},
                          capture_output=True, text=True, timeout=60)


def test_appending_the_fragment_over_a_site_authinfo_is_flagged(slurm, tmp_path: Path) -> None:
    """The site sets AuthInfo=socket=...; appending `render-conf` output adds a second AuthInfo
    without the socket. Slurm takes the last one: every command fails to reach munge. The
    validator used to say "ok (0 warnings)"."""
    text = slurm.conf_path.read_text()
    site = text[:text.index("# ttsfleet: the slurm.conf settings")]  # the site's own part
    site += f"AuthInfo=socket={slurm.munge_socket}\n"
    appended = tmp_path / "appended.conf"
    appended.write_text(site + render_fill_conf(nodes=slurm.nodelist, grace_period_s=5, cred_expire_s=30))
    (tmp_path / "gres.conf").write_text((slurm.etc / "gres.conf").read_text())
    (tmp_path / "cgroup.conf").write_text((slurm.etc / "cgroup.conf").read_text())

    broken = _sinfo(appended)
    if not Path("/run/munge/munge.socket.2").exists():  # no system munged to fall back on
        assert broken.returncode != 0 and "munge" in broken.stderr.lower(), broken.stderr
    findings = validate_file(str(appended), CAT)
    auth = [f for f in findings if "AuthInfo is set on lines" in f.message]
    assert len(auth) == 1 and auth[0].severity == "error", findings
    assert f"socket={slurm.munge_socket} is lost" in auth[0].message
    assert "merge them into one AuthInfo= line" in auth[0].message
    assert main(["slurm", "validate-conf", str(appended)]) == 2

    merged = tmp_path / "merged.conf"
    merged.write_text(site.replace(f"AuthInfo=socket={slurm.munge_socket}\n", "") + render_fill_conf(
        nodes=slurm.nodelist, grace_period_s=5, cred_expire_s=30, munge_socket=str(slurm.munge_socket)))
    assert not [f for f in validate_file(str(merged), CAT) if f.severity == "error"]
    ok = _sinfo(merged)
    assert ok.returncode == 0 and "fill" in ok.stdout, ok.stderr


def test_repeated_keys_and_records_are_flagged() -> None:
    text = site_conf() + ("SlurmctldParameters=enable_configless\n"
                          "KillWait=30\nKillWait=30\n"
                          "PartitionName=fill Nodes=gpu[01-02] PriorityTier=1 PreemptMode=REQUEUE "
                          "GraceTime=5\n")
    findings = check_conf(parse_conf(text), CAT)

    def about(start: str):
        (hit,) = [f for f in findings if f.message.startswith(start)]
        return hit

    params = about("SlurmctldParameters is set on lines")
    assert params.severity == "error" and "preempt_send_user_signal is lost" in params.message
    assert about("KillWait is set").severity == "warning" and "same value" in about("KillWait").message
    fill = about("PartitionName=fill is defined")
    assert fill.severity == "error" and "defined 2 times" in fill.message
