"""The kopf operator (node labels) and the kube-scheduler extender (group locality)."""
