"""ttsfleet.fill_jobs — checkpointable, preemptible TTS data-cleaning jobs.

A fill job cleans a JSONL speech manifest (one deterministic shard of it) through the stages in
:mod:`ttsfleet.fill_jobs.pipeline` and survives eviction at any instant: outputs are committed in
atomic batches that the checkpoint names (:mod:`~ttsfleet.fill_jobs.outputs`,
:mod:`~ttsfleet.fill_jobs.checkpoint`), SIGTERM/SIGUSR1/SIGINT end in an orderly stop with exit
code 99, and a restart resumes exactly where the last commit ended (:mod:`~ttsfleet.fill_jobs.runner`).

May import the ttsfleet core only (plus audio libraries); the operator and the Slurm agent run
these jobs through the CLI, never by importing scheduler code here.
"""
