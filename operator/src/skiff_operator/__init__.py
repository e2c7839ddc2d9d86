"""Skiff's Kubernetes operator: InferenceModel -> Deployments and Services running the Skiff runtime."""
