"""End-to-end tests against a real Kubernetes control plane (see tests/e2e/conftest.py)."""
