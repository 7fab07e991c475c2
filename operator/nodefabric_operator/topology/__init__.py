"""The fleet's checked locality hierarchy and its projection into what other schedulers read (issue 21).

Pure modules: `levels` (which levels, under which label keys), `nesting` (the check over the live fleet's
node labels), `project` (Kueue and KAI Topology, Volcano HyperNodes), `report` (the FabricTopology object,
Events). `shell` is the thin part that watches Nodes and writes.
"""
