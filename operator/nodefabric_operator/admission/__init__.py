"""Group admission by scheduling gates: pods of a distributed group wait behind the gate
`placement.<domain>/group` until the whole group fits; nodefabric then records the assignment in a
PlacementGroup, pins each pod to its node and removes the gate, and the stock kube-scheduler binds them."""
