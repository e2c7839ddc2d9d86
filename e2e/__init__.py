"""End-to-end tests and the demo, against a real Kubernetes control plane (see docs/e2e.md)."""
