"""ttsfleet.operator — the kopf operator for TTSDeployment and FillJob resources.

Thin adapter: it observes Kubernetes (and Prometheus), calls :mod:`ttsfleet.policy`, and applies
the decisions. May import the ttsfleet core, kopf, kubernetes and the fill stage registry
(``ttsfleet.fill_jobs.registry``, torch-free: FillJob stages are validated at creation); never
inference or slurm.
Imported as ``ttsfleet.operator`` (the folder is mapped by pyproject), so the stdlib's
``operator`` module is never shadowed.

Modules, from the outside in:

* ``cli`` — ``ttsfleet operator run | crds | render``; ``main`` — the process (kopf, /metrics,
  /healthz); ``leader`` — leader election on a Lease (``--leader-elect``, two replicas);
  ``handlers`` — the kopf registry, one small handler per event; ``runtime`` — shared clients,
  catalog, metrics.
* ``inference`` — TTSDeployment reconcile and autoscaling step; ``fill`` — the FillJob pass.
* Pure parts: ``models`` (CRD spec/status, the schema source), ``crds`` (schema generation),
  ``desired`` (spec → Deployment/Service/PDB), ``fillview`` (nodes/pods → policy observations, fill
  pods, shard accounting), ``signals`` (metrics parsing, PromQL), ``status`` (conditions),
  ``reconcile`` (create-or-patch by diff), ``quantity`` (the API server's canonical quantities),
  ``autoscalestate`` (the autoscaler's state in status and back); ``kube`` — the async REST
  client; ``informer`` — the watch-fed pod and node caches the controllers observe.
* The local control plane and fake kubelet the tests and the demo run on live in
  :mod:`ttsfleet.devtools` (never imported from here).
"""
