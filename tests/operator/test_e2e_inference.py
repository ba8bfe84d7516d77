"""The kopf operator end to end against kmock: create, update, scale, delete, invalid specs."""

from __future__ import annotations

import kubernetes_validate
import pytest

from tests.operator.conftest import running_operator
from tests.operator.helpers import DEPLOY, EVENTS, PDB, SVC, TTSD, live, names, objects, ttsd, wait_for

pytestmark = pytest.mark.looptime


async def test_create_update_delete(cluster, make_runtime):
    rt = make_runtime()
    async with running_operator(rt):
        await cluster.post("/apis/ttsfleet.io/v1alpha1/namespaces/ns1/ttsdeployments", json=ttsd())
        await wait_for(lambda: live(cluster, DEPLOY, "ns1", "voice-rtx5090"))
        assert names(cluster, DEPLOY) == ["voice-h200", "voice-rtx5090"]
        assert names(cluster, SVC) == ["voice", "voice-h200", "voice-rtx5090"]
        assert names(cluster, PDB) == ["voice-h200", "voice-rtx5090"]
        dep = live(cluster, DEPLOY, "ns1", "voice-h200")
        cr = live(cluster, TTSD, "ns1", "voice")
        assert dep["metadata"]["ownerReferences"][0]["uid"] == cr["metadata"]["uid"]
        assert dep["spec"]["replicas"] == 1
        st = await wait_for(lambda: live(cluster, TTSD, "ns1", "voice")["status"]["pools"])
        assert [p["name"] for p in st] == ["h200", "rtx5090"]
        # What the operator actually wrote (owner references included) is valid Kubernetes 1.31.
        written = [o for r in (DEPLOY, SVC, PDB, EVENTS) for o in objects(cluster, r).values()]
        assert len(written) >= 7
        for obj in written:
            kubernetes_validate.validate(obj, "1.31", strict=True)

        # Update: raise the h200 floor, drop the rtx5090 pool.
        spec = ttsd()["spec"]
        spec["pools"] = [dict(spec["pools"][0], minReplicas=3)]
        await cluster.patch("/apis/ttsfleet.io/v1alpha1/namespaces/ns1/ttsdeployments/voice",
                            json={"spec": spec}, headers={"Content-Type": "application/merge-patch+json"})
        await wait_for(lambda: live(cluster, DEPLOY, "ns1", "voice-h200")["spec"]["replicas"] == 3)
        await wait_for(lambda: live(cluster, DEPLOY, "ns1", "voice-rtx5090") is None)
        assert names(cluster, SVC) == ["voice", "voice-h200"]

        await cluster.delete("/apis/ttsfleet.io/v1alpha1/namespaces/ns1/ttsdeployments/voice")
        await wait_for(lambda: live(cluster, TTSD, "ns1", "voice") is None)
        await wait_for(lambda: not names(cluster, DEPLOY))
    assert names(cluster, SVC) == [] and names(cluster, PDB) == []
