"""ttsfleet: cluster operations for autoregressive TTS inference on mixed GPU fleets.

The core (this package's own modules) is shared by every component:

* :mod:`ttsfleet.catalog` — GPU classes (the only place one is described): arch and kernel
  dispatch, quantization, node label, serving defaults, capacity curves;
* :mod:`ttsfleet.quantization` — the quantization vocabulary (``auto``/``bsgemm_fp8``/``mxfp8``/
  ``bf16``) every component parses with;
* :mod:`ttsfleet.contracts.serving` — the ``TTSFLEET_*`` variables the server reads, the operator writes;
* :mod:`ttsfleet.metrics` — the metric contract (every Prometheus name and label);
* :mod:`ttsfleet.config` — pydantic config models used on the wire and in code;
* :mod:`ttsfleet.errors` / :mod:`ttsfleet.contracts.exits` — one-line user errors, shared exit codes;
* :mod:`ttsfleet.switches` — process-wide ``TTSFLEET_*`` switches read once at first use (the
  model's kernels and layers define them; the server checks every registered one at start);
* :mod:`ttsfleet.policy` — the pure decision functions (autoscaling, demand forecast, fill
  admission/eviction);
* :mod:`ttsfleet.sim` — the fleet simulator, an adapter over the policy.

Components, each in its own top-level folder and importable as ``ttsfleet.<component>``:
``operator`` (kopf), ``inference`` (DualAR TTS server), ``kernels`` (FP8 GEMMs), ``fill_jobs``
(checkpointable cleaning jobs), ``slurm`` (partitions, fill agent, exporter). Dependencies point
one way: components import the core, never the reverse.
"""

__version__ = "0.1.0"
