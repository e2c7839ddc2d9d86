"""Developer tools around the project: the local control plane, `make up`, `make demo`, the chart's generated files,
the container images and the vendored third-party files (docs/e2e.md). The e2e tests use them; they never use e2e."""
