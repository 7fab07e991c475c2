"""kubelet device-plugin servers for the three RDMA resource families."""
