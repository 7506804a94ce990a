"""Cluster state: the hot N×R arrays (``cluster``) and the adapters that feed them."""
