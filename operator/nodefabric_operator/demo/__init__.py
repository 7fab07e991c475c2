"""The embedded default: `nodefabric demo` and what it embeds.

`kubeapi` is the in-process Kubernetes API the demo runs every component against (the tests use it
too); `fleet` is the simulated GPU fleet and kube-scheduler's side of the extender protocol; `main` is
the command.
"""
