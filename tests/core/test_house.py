"""The house's two core changes made real: a GPU class is one catalog file, a signal is one row.

(The simulate / desired-objects parts of the B200 test live with the simulator and operator.)
"""

from __future__ import annotations

import textwrap

import pytest

from ttsfleet.catalog import NODE_LABEL_KEY, GpuCatalog
from ttsfleet.config import AutoscaleConfig, PoolSpec
from ttsfleet.policy import (
    PRESSURES,
    AutoscaleState,
    DeploymentSignals,
    PoolSignals,
    Pressure,
    clamp_replicas,
    decide_replicas,
)

#: Everything a B200 is, in one file. The capacity figures are placeholders for this test, not
#: measurements (a real entry takes them from ``ttsfleet bench`` on the card).
B200_YAML = textwrap.dedent("""\
    classes:
      b200:
        display_name: NVIDIA B200 180GB
        arch: sm_100a
        memory_gb: 180
        quantization: mxfp8
        model_load_s: 90
        relative_cost: 1.4
        capacity:
          source: "placeholder for tests, not measured"
          points:
            - {concurrency: 1, frames_per_s: 200, ttfa_s: 0.07}
            - {concurrency: 64, frames_per_s: 10000, ttfa_s: 0.10}
    """)


@pytest.fixture
def b200_catalog(tmp_path) -> GpuCatalog:
    f = tmp_path / "b200.yaml"
    f.write_text(B200_YAML)
    return GpuCatalog.load(f)


def test_b200_is_one_catalog_file(b200_catalog):
    cat = b200_catalog
    b = cat.get("b200")
    assert cat.names() == ["b200", "h200", "rtx5090", "rtx6000pro"]  # merged over the built-ins
    assert b.compute_capability == (10, 0)
    # the scheme brings its block layout; the name is the node label
    assert (b.activation_block, b.weight_block, b.scale_format) == ((1, 32), (1, 32), "ue8m0")
    assert b.node_selector() == {NODE_LABEL_KEY: "b200"}
    assert cat.class_of_node({NODE_LABEL_KEY: "b200"}) == b
    # the policy sizes it by its curve: the fastest class is now the reference
    assert cat.relative_throughput("b200") == 1.0 and cat.relative_throughput("h200") < 1.0


def test_b200_dispatch_through_the_loader(b200_catalog):
    from ttsfleet.inference.loader import device_dispatch, quantization_for_capability

    d = device_dispatch((10, 0), b200_catalog)
    assert (d.gpu_classes, d.quantization, d.kernel_backend) == (("b200",), "mxfp8", "reference")
    assert quantization_for_capability("auto", (10, 0), b200_catalog) == "mxfp8"
    # without the file a B200 is an unknown device: bf16, no guessed FP8 table
    assert quantization_for_capability("auto", (10, 0), GpuCatalog.default()) == "bf16"
    assert quantization_for_capability("auto", (9, 0), b200_catalog) == "bsgemm_fp8"
    assert quantization_for_capability("none", (10, 0), b200_catalog) == "bf16"
    assert quantization_for_capability("auto", None, b200_catalog) == "bf16"  # CPU


def test_b200_appears_in_generated_descriptions(b200_catalog):
    assert b200_catalog.names_text() == "b200 | h200 | rtx5090 | rtx6000pro"
    assert "b200 (sm_100a): mxfp8" in b200_catalog.quantization_text()
    assert "| b200 | NVIDIA B200 180GB | sm_100a | 180 GB | mxfp8 |" in b200_catalog.markdown_table()
    assert "b200" not in GpuCatalog.default().names_text()


def test_b200_file_errors_are_one_line(tmp_path):
    from ttsfleet.errors import UserError

    f = tmp_path / "b200.yaml"
    f.write_text(B200_YAML.replace("sm_100a", "blackwell"))
    with pytest.raises(UserError, match=r"^catalog .*b200.yaml: class 'b200': arch: String should") as e:
        GpuCatalog.load(f)
    assert "\n" not in str(e.value)


# ------------------------------------------------------------------ a signal is one row
CAT = GpuCatalog.default()
CFG = AutoscaleConfig(target_in_flight_per_replica=40)
POOL = PoolSpec(gpu_class="h200", min_replicas=1, max_replicas=10)
#: The toy signal: real-time factor (seconds to synthesize one second of audio) above 1.0 means
#: the pool falls behind playback even though its in-flight load is on target.
RTF = Pressure("rtf", "real_time_factor", 1.0, "real-time factor {value:.2f} > {threshold:g}")


def _decide(rtf: float, pressures=PRESSURES):
    sig = PoolSignals(in_flight=160, ready_replicas=4, current_replicas=4,
                      extra={"real_time_factor": rtf})
    decision, _ = decide_replicas(CFG, [POOL], CAT, AutoscaleState(),
                                  DeploymentSignals(0.0, {POOL.key: sig}), pressures=pressures)
    return decision.pools[0]


def test_a_toy_signal_added_as_one_row_drives_a_decision():
    assert _decide(1.3).reason == "steady"  # the built-in table does not know the signal
    with_rtf = (*PRESSURES, RTF)  # the one row
    d = _decide(1.3, with_rtf)
    assert (d.desired, d.direction, d.reason) == (5, "up", "rtf")
    assert d.message == "real-time factor 1.30 > 1"
    assert _decide(0.8, with_rtf).reason == "steady"  # below its threshold: no pressure


def test_rows_read_their_threshold_knob_and_keep_their_order():
    queue = next(p for p in PRESSURES if p.reason == "queue")
    assert queue.limit(AutoscaleConfig(queue_depth_per_replica=2)) == 2.0
    sig = PoolSignals(in_flight=120, queue_depth=30, ready_replicas=4, current_replicas=4,
                      ttfa_p99_s=0.9, extra={"real_time_factor": 2.0})
    d, _ = decide_replicas(CFG, [POOL], CAT, AutoscaleState(), DeploymentSignals(0.0, {"h200": sig}),
                           pressures=(RTF, *PRESSURES))
    assert d.pools[0].reason == "rtf"  # the first row that fires names the decision
    d, _ = decide_replicas(CFG, [POOL], CAT, AutoscaleState(), DeploymentSignals(0.0, {"h200": sig}))
    assert d.pools[0].reason == "slo"


def test_the_one_replica_clamp():
    assert [clamp_replicas(POOL, n) for n in (0, 1, 7, 10, 99)] == [1, 1, 7, 10, 10]
