"""The fleet simulator: replays a traffic trace through the policy on a simulated fleet.

An adapter like the operator and the Slurm agent: it builds observations, calls
:mod:`ttsfleet.policy` at the operator's cadence, and carries out the decisions on a model of the
fleet (pod start latency, eviction grace, checkpoint interval, per-class capacity curves).
"""
