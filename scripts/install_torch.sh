#!/usr/bin/env bash
# Installs PyTorch (CPU use) and what speculators' CLIs and trainer import into a separate
# site directory, for the tests that run speculators' own command lines against hsx
# (tests/python/test_speculators_cli.py, test_toy_loop.py). Prints the directory; the tests
# find it through HSX_TORCH_SITE. The rest of the suite keeps running without torch.
#
# PyPI has no CPU-only torch: its wheel is built for CUDA 13.2 and loads CUDA's libraries at
# import. On a CPU machine with the CUDA 13.0 toolkit (/usr/local/cuda/lib64) it imports and
# runs with exactly four more of NVIDIA's wheels, the libraries that toolkit lacks or has too
# old (its NCCL has no ncclCommResume). Everything is installed with --no-deps at pinned
# versions (no resolver: speculators 0.9.0 pins torch<=2.14.1 and transformers<=5.19, which
# the versions here run past; docs/DEPENDENCIES.md says why these).
# Idempotent: a stamp file holds the pins of the last complete install; a second run is a
# file comparison. Set HSX_TORCH_SITE to choose the directory (emptied and refilled when
# the pins change).
set -euo pipefail
site=${HSX_TORCH_SITE:-${XDG_CACHE_HOME:-$HOME/.cache}/hsx/torch-site}
pins=(
  torch==2.15.0
  # The CUDA 13 libraries torch 2.15 loads that the CUDA 13.0 toolkit lacks (one pip command:
  # they share the nvidia/ folder, which a second `pip install --target` would replace).
  nvidia-cufile==1.20.0.107 nvidia-cusparselt-cu13==0.10.0 nvidia-nvshmem-cu13==3.8.0 nvidia-nccl-cu13==2.32.6
  # torch's pure-Python dependencies
  sympy==1.14.0 mpmath==1.4.1 networkx==3.6.1
  # speculators' data loading (datasets and what it imports) and its trainer's logging
  datasets==4.4.1 dill==0.4.0 multiprocess==0.70.18 xxhash==4.1.0 pyarrow==26.0.1 pandas==3.1.1
  python-dateutil==2.9.0.post0 six==1.17.0 loguru==0.7.3 psutil==7.2.2
  pydantic-settings==2.14.1 python-dotenv==1.2.2
)
stamp=$site/.hsx-pins
if [ "$(cat "$stamp" 2>/dev/null)" != "${pins[*]}" ]; then
  rm -rf "$site"
  python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore --no-deps --only-binary=:all: \
    --target "$site" "${pins[@]}" >&2
  echo "${pins[*]}" > "$stamp"
fi
echo "$site"
