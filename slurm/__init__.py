"""ttsfleet.slurm — Slurm partitions, sbatch fill templates, backends, fill agent and exporter.

Thin adapter over :mod:`ttsfleet.policy`. May import the ttsfleet core; runs fill jobs through
the fill job CLI.
"""
