"""ttsfleet.fill_jobs — checkpointable, preemptible TTS data-cleaning jobs.

May import the ttsfleet core only (plus audio libraries); the operator and the Slurm agent run
these jobs through the CLI, never by importing scheduler code here.
"""
