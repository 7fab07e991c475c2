"""The DRA driver: RDMA endpoints as Dynamic Resource Allocation devices, beside the device plugin.

- `devices`: which endpoints of a record form the node's pool, and their stable device names (pure);
- `slices`: the ResourceSlices of the pool and what to write to reach them from the live ones (pure);
- `publish`: the API shell that lists, creates, updates and deletes this node's slices;
- `claims`: what a ResourceClaim allocated to this node's pool (pure);
- `cdi`: one CDI spec per prepared claim (content pure, the file written atomically);
- `checkpoint`: prepared claims on disk, so unprepare after a restart removes the right spec;
- `prepare`: NodePrepareResources / NodeUnprepareResources, per claim, never failing the whole call;
- `server`: the kubelet-facing gRPC servers (registration socket, DRA socket with v1 and v1beta1);
- `driver`: runs all of it from the latest record; `cli` / `slices_cli`: the two commands.
"""
