"""A bounded schemathesis run against ``/openapi.json``: positive and negative examples for every
operation the server documents, in JSON and msgpack; no input may yield a 5xx.

Bounded for CI: up to 40 positive + 40 negative examples per operation (about 500 requests, ~40 s), against a
server whose own caps (4 frames per segment, 200 characters) keep every valid synthesis short.
"""

from __future__ import annotations

import msgpack
import pytest

from .conftest import API_KEY

schemathesis = pytest.importorskip("schemathesis")
hypothesis = pytest.importorskip("hypothesis")

EXAMPLES_PER_MODE = 40


@schemathesis.serializer("application/msgpack")
def _msgpack(ctx, value):
    try:
        return msgpack.packb(value, use_bin_type=True)
    except (TypeError, ValueError, OverflowError):  # values msgpack cannot carry: send them as JSON text
        import json

        return json.dumps(value, default=str).encode()


@pytest.fixture(scope="module")
def fuzz_server(server_factory):
    return server_factory("--max-new-tokens", "4", "--max-text-chars", "200", "--max-running-requests", "4",
                          "--max-queue", "64", api_key=API_KEY)


def _fuzz(op, mode, url: str, seen: list[tuple[str, int, str]]) -> None:
    """Run one operation's examples in one generation mode; record (path, status, body) per call."""
    from hypothesis import HealthCheck, Phase, given, settings

    @settings(max_examples=EXAMPLES_PER_MODE, deadline=None, database=None, derandomize=True,
              phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))
    @given(case=op.as_strategy(generation_mode=mode))
    def run(case):
        resp = case.call(base_url=url, headers={"Authorization": f"Bearer {API_KEY}"}, timeout=120)
        text = resp.content[:200].decode("utf-8", "replace") if resp.status_code >= 400 else ""
        seen.append((op.path, resp.status_code, text))
        if 400 <= resp.status_code < 500:  # every refusal is the JSON error body
            body = resp.json()
            assert body["status"] == resp.status_code and body["message"], resp.text

    try:
        run()
    except hypothesis.errors.Unsatisfiable:  # nothing to break (e.g. GET /healthz has no inputs)
        assert mode == schemathesis.GenerationMode.NEGATIVE, op.path


@pytest.mark.slow
def test_no_input_yields_a_server_error(fuzz_server):
    schema = schemathesis.openapi.from_url(f"{fuzz_server.url}/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert {op.path for op in operations} >= {"/v1/tts", "/v1/audio/speech", "/v1/references/add"}
    seen: list[tuple[str, int, str]] = []
    for op in operations:
        for mode in (schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE):
            _fuzz(op, mode, fuzz_server.url, seen)
    server_errors = [s for s in seen if s[1] >= 500]
    assert not server_errors, server_errors[:10]
    assert len(seen) >= 300
    served = {path for path, status, _ in seen if status == 200}
    assert {"/v1/tts", "/v1/audio/speech"} <= served  # valid examples reached the engine and got audio
    with fuzz_server.client() as c:
        assert c.get("/readyz").status_code == 200  # and the server still serves
