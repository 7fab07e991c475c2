"""The process shell every long-running command (agent, deviceplugin, draplugin, operator, extender,
placement) is wrapped in, written once:

- `flags`: the metrics and probe address and port flags, one spelling on every command;
- `server`: the one /metrics, /healthz and /readyz HTTP server (aiohttp, on the command's event loop);
- `errors`: the one StartupError, logged as one structured line, exit status 2;
- `signals`: SIGTERM and SIGINT set the command's stop event, and the process exits STOP_GRACE_S seconds
  later whatever is still running.

Stdlib, aiohttp and prometheus_client only: the node side imports it, and must not pull in kubernetes or
kopf.
"""
