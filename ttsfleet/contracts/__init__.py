"""The doors: every value that crosses from one process to another, defined once.

Each module is one door, imported by both sides of it and crossed by one test in
``tests/doors/``:

* :mod:`~ttsfleet.contracts.serving` — operator → inference server pod: the ``TTSFLEET_*``
  variables, the inference port, the run's catalog handed over as a mounted file;
* :mod:`~ttsfleet.contracts.fill` — operator / Slurm agent → fill job → back: the ``fill run``
  argv, env names, metrics port, the checkpoint layout (:func:`~ttsfleet.contracts.fill.
  checkpoint_file`, :func:`~ttsfleet.contracts.fill.shard_state`), grace period and checkpoint
  interval defaults, and :func:`~ttsfleet.contracts.fill.work_at_risk`, the one way every
  adapter (operator, Slurm agent, simulator, the job's own gauge) counts un-checkpointed work;
* :mod:`~ttsfleet.contracts.exits` — the exit codes schedulers act on (99: checkpointed, requeue).

Pure and light (the standard library only): the operator, the server, the fill job and the Slurm
agent import it without each other's dependencies.
"""
