"""Dashboards and Prometheus rules generated from the metric contract.

May import the ttsfleet core only (and grafana-foundation-sdk when building dashboards).
"""
