"""End-to-end tests against a real Kubernetes control plane (see docs/e2e.md); the tools they run are in devtools/."""
