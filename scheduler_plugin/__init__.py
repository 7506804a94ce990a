"""The kube-scheduler extender. Not yet implemented: see the extender issue."""
