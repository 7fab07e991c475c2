"""The node agent: reads this host every pass and keeps the node's Devices object in step with it.

Modules, one job each: `publish` decides (pure), `kube` talks to the API, `core` runs passes and the
loop, `uevents` turns kernel events into pass triggers, `metrics`/`serve` expose Prometheus metrics and
health probes, `cli` is the `nodefabric agent` command.
"""
