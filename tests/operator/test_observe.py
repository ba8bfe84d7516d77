"""Pure observation functions: metrics parsing, quantiles, GPU accounting, shard bookkeeping."""

from __future__ import annotations

import time

from prometheus_client import generate_latest
from ttsfleet.operator import fillview as fv
from ttsfleet.operator.inference import least_busy
from ttsfleet.operator.models import FillJobSpec
from ttsfleet.operator.signals import bucket_delta, histogram_quantile, parse_metrics, promql

from tests.operator.helpers import filljob, node
from ttsfleet.catalog import GpuCatalog
from ttsfleet.contracts.fill import ShardState
from ttsfleet.metrics import make_collectors
from ttsfleet.policy import plan_fill

CAT = GpuCatalog.default()

SPEC = FillJobSpec.model_validate(filljob()["spec"], context={"catalog": CAT})


def exposition(in_flight: float, queue: float, ttfa: list[float]) -> str:
    c = make_collectors("inference")
    c["inference_requests_in_flight"].labels(model="a").set(in_flight)
    c["inference_queue_depth"].labels(model="a").set(queue)
    for v in ttfa:
        c["inference_ttfa_seconds"].labels(model="a").observe(v)
    return generate_latest(c.registry).decode()


def test_parse_real_exposition_and_quantile() -> None:
    s = parse_metrics(exposition(7, 3, [0.06] * 98 + [0.9, 2.5]))
    assert (s.in_flight, s.queue_depth) == (7, 3)
    assert s.ttfa_buckets[-1] == (float("inf"), 100)
    p50 = histogram_quantile(0.5, s.ttfa_buckets)
    p99 = histogram_quantile(0.99, s.ttfa_buckets)
    assert 0.05 < p50 <= 0.075
    assert 0.75 < p99 <= 1.0
    assert histogram_quantile(0.99, ()) is None


def test_bucket_delta_windows_and_resets() -> None:
    before = ((0.1, 10.0), (float("inf"), 10.0))
    now = ((0.1, 10.0), (float("inf"), 15.0))
    assert bucket_delta(now, before) == ((0.1, 0.0), (float("inf"), 5.0))
    assert histogram_quantile(0.99, bucket_delta(now, before)) == 0.1  # all new ones above 0.1
    reset = ((0.1, 1.0), (float("inf"), 1.0))
    assert bucket_delta(reset, before) == reset


def test_promql_targets_one_pool() -> None:
    q = promql("ns1", "voice-h200", 15)
    assert q["in_flight"].startswith("sum by (pod) (ttsfleet_inference_requests_in_flight{")
    assert 'namespace="ns1"' in q["p99"] and "[30s]" in q["p99"]
    assert "voice\\\\-h200" in q["queue"] or "voice-h200" in q["queue"]


def test_least_busy_picks_idle_pods() -> None:
    pods = [{"metadata": {"name": n}} for n in ("a", "b", "c", "d")]
    assert least_busy(pods, {"a": 5, "b": 0, "c": 2, "d": 0}, 2) == ["b", "d"]
    assert least_busy(pods, {}, 0) == []


def _pod(name: str, cls: str | None, workload: str, gpus: int = 1, node_name: str | None = None,
         phase: str = "Running", **meta: object) -> dict:
    labels = {"ttsfleet.io/workload": workload}
    spec: dict = {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]}
    if node_name:
        spec["nodeName"] = node_name
    if cls:
        spec["nodeSelector"] = {"ttsfleet.io/gpu-class": cls}
    return {"metadata": {"name": name, "namespace": "ns1", "labels": labels, **meta}, "spec": spec,
            "status": {"phase": phase}}


def test_observe_counts_gpus_by_workload() -> None:
    nodes = [node("a", "h200", 8), node("b", "h200", 8), node("c", "rtx5090", 2)]
    nodes[1]["spec"] = {"unschedulable": True}
    pods = [
        _pod("inf-1", None, "inference", 2, node_name="a"),
        _pod("inf-pending", "h200", "inference", 1, phase="Pending"),
        _pod("train", None, "training", 4, node_name="a"),
        _pod("fill-1", "h200", "fill", 1, node_name="a"),
        _pod("fill-2", "h200", "fill", 1, deletionTimestamp="2026-01-01T00:00:00Z"),
        _pod("done", None, "inference", 1, node_name="a", phase="Succeeded"),
        _pod("cpu", None, "inference", 0, node_name="a"),
    ]
    obs = fv.observe(nodes, pods, t=10.0, now_wall=time.time(), checkpoint_interval_s=60, catalog=CAT)
    h = obs["h200"]
    assert (h.total_gpus, h.unavailable_gpus) == (16, 8)
    assert (h.inference_gpus, h.pending_inference_gpus, h.training_gpus) == (2, 1, 4)
    assert [(j.id, j.terminating) for j in h.fill_jobs] == [("ns1/fill-1", False), ("ns1/fill-2", True)]
    assert obs["rtx5090"].total_gpus == 2
    # The policy sees 8 usable, 2+4 held, 2 fill (one freeing): 0 free, 1 wanted -> the terminating
    # pod already covers it, nothing more is evicted.
    plan = plan_fill(SPEC.policy, h)
    assert plan.evict == () and plan.admit == 0


def _iso(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def test_work_at_risk_from_the_termination_message_or_the_start_time() -> None:
    """The operator counts un-checkpointed work with the contract's one function: a running pod
    from its start time (every interval since assumed checkpointed), a finished one from the last
    checkpoint its termination message names, up to when it ended."""
    now = 1_000_000.0
    started = {"metadata": {}, "status": {"startTime": _iso(now - 130)}}
    assert fv.seconds_since_checkpoint(started, now, 60) == 10
    assert fv.seconds_since_checkpoint({"metadata": {}, "status": {}}, now, 60) == 0  # not started
    state = ShardState(3, 6, "running", 40, 100, now - 100)
    crashed = {"metadata": {}, "status": {"startTime": _iso(now - 130), "containerStatuses": [{"state": {
        "terminated": {"exitCode": 137, "startedAt": _iso(now - 130), "finishedAt": _iso(now - 30),
                       "message": state.to_json()}}}]}}
    assert fv.pod_shard_state(crashed) == state
    assert fv.seconds_since_checkpoint(crashed, now, 60) == 70  # last checkpoint -> the kill
    garbled = {"status": {"containerStatuses": [{"state": {"terminated": {"message": "Traceback ..."}}}]}}
    assert fv.pod_shard_state(garbled) is None


def _finished(name: str, shard: int, code: int) -> dict:
    return {"metadata": {"name": name, "labels": {fv.L_SHARD: str(shard)}},
            "status": {"phase": "Succeeded" if code == 0 else "Failed",
                       "containerStatuses": [{"state": {"terminated": {"exitCode": code}}}]}}


def test_account_exit_codes_and_vanished_pods() -> None:
    status = {"activePods": ["clean-4-0", "clean-5-0"], "completedShards": "1", "shardFailures": {"3": 3}}
    pods = [_finished("clean-0-0", 0, 0), _finished("clean-2-0", 2, 99), _finished("clean-3-3", 3, 137),
            {"metadata": {"name": "clean-5-0", "labels": {fv.L_SHARD: "5"}}, "status": {"phase": "Running"}}]
    acc = fv.account(status, pods, SPEC, time.time())
    assert acc.done == {0, 1}
    assert acc.preemptions == 1 + 1  # exit 99 + clean-4-0 vanished
    assert acc.failed == {3} and acc.failures["3"] == 4
    assert acc.active == ["clean-5-0"] and acc.running_shards == {5}
    assert acc.accounted == ["clean-0-0", "clean-2-0", "clean-3-3"] and acc.to_delete == []
    # Next pass: the same finished pods are not counted twice, they are deleted.
    again = fv.account({**status, "activePods": acc.active, "accountedPods": acc.accounted,
                        "completedShards": fv.format_ranges(acc.done),
                        "failedShards": fv.format_ranges(acc.failed),
                        "preemptionsSurvived": acc.preemptions, "shardFailures": acc.failures},
                       pods, SPEC, time.time())
    assert again.preemptions == acc.preemptions and again.to_delete == acc.accounted
    assert fv.next_shards(SPEC, again, 10) == [2, 4]


def test_a_shard_whose_checkpoint_says_complete_is_done_whatever_the_exit() -> None:
    """Killed after its last commit (exit 137, message: complete): the shard is done, not failed."""
    pod = _finished("clean-2-0", 2, 137)
    pod["status"]["containerStatuses"][0]["state"]["terminated"]["message"] = \
        ShardState(2, 6, "complete", 10, 10, time.time()).to_json()
    acc = fv.account({}, [pod], SPEC, time.time())
    assert acc.done == {2} and acc.failures == {}


def test_ranges_and_names() -> None:
    assert fv.format_ranges([5, 0, 1, 2, 7, 8]) == "0-2,5,7-8"
    assert fv.parse_ranges("0-2,5,7-8") == {0, 1, 2, 5, 7, 8}
    assert fv.pod_name("clean", 3, {"clean-3-0", "clean-3-1"}) == "clean-3-2"


def test_gpu_activity_by_workload() -> None:
    from ttsfleet.operator.inventory import active, allocation

    nodes = [node("a", "h200", 8)]
    pods = [_pod("inf-busy", None, "inference", 1, node_name="a"),
            _pod("inf-idle", None, "inference", 1, node_name="a"),
            _pod("fill-1", "h200", "fill", 2, node_name="a"),
            _pod("fill-pending", "h200", "fill", 1, phase="Pending"),
            _pod("train", None, "training", 3, node_name="a")]
    busy = {"ns1/inf-busy": True, "ns1/inf-idle": False}
    assert active(nodes, pods, busy, CAT) == {"h200": {"inference": 1, "fill": 2, "training": 3}}
    obs = fv.observe(nodes, pods, t=0.0, now_wall=time.time(), checkpoint_interval_s=60, catalog=CAT)["h200"]
    assert allocation(obs) == {"inference": 2, "training": 3, "fill": 3, "idle": 0}


async def test_two_pools_keep_their_own_ttfa_baselines() -> None:
    """A pool's p99 is over the requests since its last scrape, whatever other pool is scraped in
    between (the loop test found one source shared by both pools reporting each pod's whole
    history, so a burst's slow first audio held the SLO pressure on for ever)."""
    import httpx
    from ttsfleet.operator.inference import Memory, measure
    from ttsfleet.operator.models import TTSDeploymentSpec

    from tests.operator.conftest import MetricsServer

    pools = [{"gpuClass": "h200"}, {"gpuClass": "rtx5090"}]
    spec = TTSDeploymentSpec.model_validate({"model": {"checkpoint": "tiny"}, "image": "i", "pools": pools},
                                            context={"catalog": CAT})
    servers = {pool: await MetricsServer().start() for pool in ("h200", "rtx5090")}
    pods = [{"metadata": {"name": f"v-{pool}-1", "labels": {"app.kubernetes.io/instance": "v",
                                                             "ttsfleet.io/pool": pool}},
             "spec": {"containers": [{"ports": [{"name": "http", "containerPort": srv.port}]}]},
             "status": {"phase": "Running", "podIP": "127.0.0.1"}} for pool, srv in servers.items()]
    async with httpx.AsyncClient() as http:
        rt, mem = type("Rt", (), {"prometheus_url": None, "http": http})(), Memory()
        try:
            for srv in servers.values():
                srv.set(in_flight=0, ttfa=[5.0] * 20)  # a burst's slow first audio
            first = await measure(rt, mem, "ns", "v", spec, pods)  # type: ignore[arg-type]
            assert all(m.ttfa_p99_s is not None and m.ttfa_p99_s > 2 for m in first.values())
            for srv in servers.values():
                srv.set(in_flight=0, ttfa=[0.1])
            later = await measure(rt, mem, "ns", "v", spec, pods)  # type: ignore[arg-type]
            assert {k: m.ttfa_p99_s is not None and m.ttfa_p99_s <= 0.25 for k, m in later.items()} == {
                "h200": True, "rtx5090": True}, {k: m.ttfa_p99_s for k, m in later.items()}
        finally:
            for srv in servers.values():
                await srv.stop()


def test_a_pod_on_a_lost_node_is_stuck_only_past_its_deadline_and_the_grace() -> None:
    """``stuck_on_lost_node``: Terminating past deletionTimestamp + ``STUCK_AFTER_S`` on a NotReady or
    vanished node; not before, not on a Ready node, not while not Terminating. (The e2e test of the
    release, ``kube/test_e2e_fill.py``, runs with a shorter grace: the wait itself is checked here.)"""
    deadline = fv.parse_time("2026-12-01T00:00:00Z")
    pod = {"metadata": {"name": "p", "deletionTimestamp": "2026-12-01T00:00:00Z"}, "spec": {"nodeName": "n"}}

    def node(ready: str) -> dict:
        return {"metadata": {"name": "n"}, "status": {"conditions": [{"type": "Ready", "status": ready}]}}

    past = deadline + fv.STUCK_AFTER_S
    assert fv.STUCK_AFTER_S >= 10  # a slow but live kubelet keeps its time to finish
    assert not fv.stuck_on_lost_node(pod, [node("False")], past - 0.5)
    assert fv.stuck_on_lost_node(pod, [node("False")], past)
    assert fv.stuck_on_lost_node(pod, [node("Unknown")], past + 60)
    assert fv.stuck_on_lost_node(pod, [], past)  # the node is gone
    assert not fv.stuck_on_lost_node(pod, [node("True")], past + 60)  # its kubelet will finish it
    running = {"metadata": {"name": "p"}, "spec": {"nodeName": "n"}}
    assert not fv.stuck_on_lost_node(running, [node("False")], past + 60)
