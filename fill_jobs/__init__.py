"""ttsfleet.fill_jobs — checkpointable, preemptible TTS data-cleaning jobs that keep a GPU busy.

A fill job cleans a JSONL speech manifest (one deterministic shard of it) through the stages
registered in :mod:`~ttsfleet.fill_jobs.registry`: per-item stages (:mod:`~.stages`) in a pool of
CPU worker processes (:mod:`~.prefetch`), admitted in shard order (:mod:`~.pipeline`), then batch
stages — codec tokens (:mod:`~.tokenize`), log-mel features (:mod:`~.features`) — on the GPU in
their own thread (:mod:`~.batching`). It survives eviction at any instant: outputs are committed
in atomic batches that the checkpoint names (:mod:`~.outputs`, :mod:`~.checkpoint`),
SIGTERM/SIGUSR1/SIGINT end in an orderly stop with exit code 99, and a restart resumes exactly
where the last commit ended (:mod:`~.runner`).

May import the ttsfleet core (plus audio libraries) and, for the codec stage only,
``ttsfleet.inference.codec`` (lazily: the registry and the CLI stay torch-free); the operator and
the Slurm agent run these jobs through the CLI, never by importing scheduler code here.
"""
