"""Observability (issue 30): Prometheus metrics of the server (broker.observe.metrics) and of a
node agent (broker.observe.agent_metrics)."""
