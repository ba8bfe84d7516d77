"""ttsfleet.operator — the kopf operator for TTSDeployment and FillJob resources.

Thin adapter: it observes Kubernetes (and Prometheus), calls :mod:`ttsfleet.policy`, and applies
the decisions. May import the ttsfleet core, kopf and kubernetes; never inference or slurm.
Imported as ``ttsfleet.operator`` (the folder is mapped by pyproject), so the stdlib's
``operator`` module is never shadowed.
"""
