"""Host reading and the Devices record."""
