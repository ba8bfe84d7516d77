"""ttsfleet.devtools — the local stand-ins for a cluster: what the tests, the demo and a laptop run.

Nothing in a production install imports this package; the operator, the Slurm agent, the server
and the fill jobs never do. It ships in the wheel so that ``ttsfleet demo`` (the whole fleet on
one machine: a real control plane, real processes in the pods, a real Slurm) and the
``ttsfleet slurm local-cluster`` / ``ttsfleet dashboards render`` commands work after
``pip install .`` — those entry points are the reason a user runs it. It may import the core and
the components (a stand-in plays the world the components act on); they never import it.

* ``localkube`` — a real Kubernetes control plane on loopback (etcd, kube-apiserver,
  controller-manager, scheduler; binaries built by ``scripts/kube-local.sh``).
* ``fakekubelet`` — plays kubelet for the control plane's GPU nodes (pod status, exits, graceful
  deletion). Weighed against kwok (kubernetes-sigs/kwok, which also builds from the Go module
  proxy): kwok drives pod status from ``Stage`` templates and its ``Exec`` only answers
  ``kubectl exec`` with a local command; it never runs a pod's own container command as a
  process, and a pod's phase is not tied to a process exit. The demo and the end-to-end tests
  need exactly that (the fill job's exit 99 on SIGTERM, the server's readiness), so the
  kubelet stays ours: one small module we can make run real commands.
* ``kubelet`` — the kubelet whose pods really run: each container's command as a local process
  (``podspec``: argv, env, mounts as host paths; ``podvolumes``; ``probes``; ``podstatus``;
  ``podnet``: the pod's own loopback address), for ``FakeNode(processes=True)`` nodes.
* ``loop`` — the whole loop on one machine (``ttsfleet demo``, ``tests/loop``): ``traffic``
  (open-loop replay against a Service), ``looprecord`` (what the cluster did), ``loopreport``
  (figures and the picture), ``democli`` (the command).
* ``localcluster`` — a real one-host Slurm (munged, slurmctld, slurmd, optional slurmrestd and
  slurmdbd) under one directory.
* ``promserver`` — a real Prometheus on backfilled TSDB blocks (tests, dashboard pictures).
* ``ports.free_port`` and ``wait.wait_for`` / ``wait.wait_for_async`` — the one copy of each.
"""
