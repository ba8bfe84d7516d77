"""The shipped Kubernetes and Slurm examples: schema-valid, and the Slurm script really requeues."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from importlib.resources import files

import pytest
import yaml

from ttsfleet.contracts.exits import PREEMPTED_REQUEUE


def test_shipped_examples_are_rendered_from_the_contract() -> None:
    """Both hand-run examples come from the fill door (argv, env, port, grace, exit 99) and the
    Slurm wrapper template: regenerate with `ttsfleet fill render-example > fill_jobs/k8s-indexed-job.yaml`
    and `ttsfleet slurm render-example > fill_jobs/slurm-fill.sh`."""
    from ttsfleet.fill_jobs.examples import render_kubernetes_example
    from ttsfleet.slurm.sbatch import render_example_script

    shipped = files("ttsfleet.fill_jobs")
    assert shipped.joinpath("k8s-indexed-job.yaml").read_text() == render_kubernetes_example()
    assert shipped.joinpath("slurm-fill.sh").read_text() == render_example_script()


def test_kubernetes_example_is_a_valid_job_that_ignores_preemption() -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    doc = yaml.safe_load(files("ttsfleet.fill_jobs").joinpath("k8s-indexed-job.yaml").read_text())
    kubernetes_validate.validate(doc, "1.31", strict=True)
    spec = doc["spec"]
    (container,) = spec["template"]["spec"]["containers"]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert int(env["TTSFLEET_FILL_SHARDS"]) == spec["completions"]
    ignored = [r["onExitCodes"]["values"] for r in spec["podFailurePolicy"]["rules"] if "onExitCodes" in r]
    assert [PREEMPTED_REQUEUE] in ignored
    assert spec["template"]["spec"]["terminationGracePeriodSeconds"] >= 10


@pytest.mark.audio
def test_slurm_example_script_stops_on_usr1_and_resumes(cli, clean_corpus, dirs) -> None:
    script = str(files("ttsfleet.fill_jobs").joinpath("slurm-fill.sh"))
    env = {**os.environ, "MANIFEST": str(clean_corpus), "OUT": str(dirs.output),
           "CKPT": str(dirs.checkpoint), "SLURM_ARRAY_TASK_ID": "1", "SLURM_ARRAY_TASK_COUNT": "2",
           "FILL_ARGS": "--stages decode,hash --item-delay-seconds 0.3 --checkpoint-every-items 1",
           "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")}
    proc = subprocess.Popen(["bash", script], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    cli.wait_for_event(proc, "checkpoint")
    time.sleep(0.2)
    proc.send_signal(signal.SIGUSR1)  # what `--signal=B:USR1@30` does at preemption
    assert proc.wait(timeout=30) == PREEMPTED_REQUEUE
    proc.stderr.close()
    proc.stdout.close()
    env["SLURM_RESTART_COUNT"] = "1"
    again = subprocess.run(["bash", script], env=env, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again.stderr
    assert [r["position"] for r in cli.manifest_rows(dirs.output)] == [1, 3, 5, 7, 9]
