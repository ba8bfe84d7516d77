"""Dashboards and Prometheus rules generated from the metric contract.

May import the ttsfleet core only (and grafana-foundation-sdk when building dashboards).

* ``model`` - dashboards as plain data (panels, targets, rows, variables) and the grid layout.
* ``figures`` - the headline PromQL (allocated / active / load-weighted utilization, TTFA SLO),
  shared by panels and recording rules.
* ``definitions`` - the four dashboards: fleet, inference, fill, Slurm.
* ``dashboards`` - Grafana JSON through grafana-foundation-sdk.
* ``rules`` - recording rules and alerts as a plain Prometheus rules file.
* ``build`` - writes / checks the generated files under ``charts/ttsfleet/``.
* ``demo``, ``render`` - a demo fleet through the project's own collectors and the PNG pictures
  drawn from the shipped queries (on the real Prometheus of :mod:`ttsfleet.devtools.promserver`).
"""
