"""Test and demo helpers: a kubelet stand-in that speaks the device-plugin API over unix sockets."""
