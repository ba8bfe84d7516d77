"""The fleet simulator: replays a traffic trace through the policy on a simulated fleet.

An adapter like the operator and the Slurm agent: it observes the simulated fleet, calls
:mod:`ttsfleet.policy` at the operator's cadence and carries out the decisions.

* ``trace`` — arrival traces (embedded diurnal generator, CSV), scaling and windows;
* ``tracefiles`` — public LLM-serving trace formats (Azure LLM inference CSV, BurstGPT,
  Mooncake JSONL) read directly, replayed request for request;
* ``scenario`` — what one run needs besides the trace: the run's catalog, fleet, config models,
  fill workload figures (``FILL_BUSY_FRACTION``), nodes, delays;
* ``traffic`` — one pool's request fluid: queue, decode slots, TTFA, replica GPU busy;
* ``fleet`` — nodes, pods, scheduler (packing, whole-node training, fill preemption), co-location
  (inference beside fill), delays and the GPU-time ledger;
* ``adapter`` — ``to_pool_signals``, ``to_class_observation`` and ``policy_step``
  (observe → policy → act);
* ``engine`` — the loop and its three modes (policy, inference-only, static-warm);
* ``summary`` / ``report`` / ``cli`` — figures, targets, table, plot, ``ttsfleet simulate``.

Imports the core (catalog, config, policy, errors) only; nothing imports it but the CLI.
"""
