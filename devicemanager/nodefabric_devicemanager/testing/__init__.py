"""Fakes of the outside world (sysfs trees, the Kubernetes API) shared by the tests and the demo."""
