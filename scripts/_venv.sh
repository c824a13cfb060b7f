# Sourced by scripts/run and scripts/test: makes ./.venv with the project installed.
# Usage: . scripts/_venv.sh [extra]   (extra: "test" adds pytest and friends)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${LOWLEVEL_VENV:-$ROOT/.venv}"
EXTRA="${1:-}"
PY="${PYTHON:-python3}"
if [ ! -x "$VENV/bin/python" ]; then
  echo "setup: creating $VENV" >&2
  "$PY" -m venv "$VENV"
fi
# install PYTHON ARGS...: `pip install ARGS` into PYTHON's venv, with uv (the same packages
# from the sources pip is configured with, scripts/_uv_args.py; ~9 s for the project where
# pip takes ~60 s) when uv installs, else with pip.
install() {
  local py="$1"; shift
  if [ -z "${UV:-}" ]; then
    UV=none
    # beside the project's packages, not among them
    if "$VENV/bin/python" -m pip install -q --target "$VENV/uv" uv >&2 2>/dev/null; then
      UV="$VENV/uv/bin/uv"
    fi
  fi
  if [ "$UV" != none ]; then
    local sources
    mapfile -t sources < <("$VENV/bin/python" "$ROOT/scripts/_uv_args.py")
    # --compile-bytecode: as pip does. Without it every process compiles TensorFlow's
    # modules anew where PYTHONDONTWRITEBYTECODE is set (CI's machine sets it): measured,
    # a clean-clone suite ran at a fraction of its speed.
    if "$UV" pip install -q --compile-bytecode --python "$py" "${sources[@]}" "$@" >&2; then
      return 0
    fi
    echo "setup: uv could not install $*; installing with pip" >&2
  fi
  "$py" -m pip install -q "$@" >&2
}
# Reinstall only when pyproject.toml or the requested extra changed.
STAMP="$VENV/.lowlevel-installed"
WANT="$(cat "$ROOT/pyproject.toml" | sha256sum | cut -c1-16)-$EXTRA"
if [ "$(cat "$STAMP" 2>/dev/null)" != "$WANT" ]; then
  echo "setup: installing lowlevel${EXTRA:+[$EXTRA]} and its dependencies (TensorFlow is large; first time only)" >&2
  install "$VENV/bin/python" -e "$ROOT${EXTRA:+[$EXTRA]}"
  echo "$WANT" > "$STAMP"
fi
# The test extra also gets checkov (a Kubernetes manifest scanner, tests/test_k8s.py) in a
# venv of its own inside .venv: its many pinned dependencies stay out of the project's.
CHECKOV_VERSION="3.3.30"
if [ "$EXTRA" = "test" ] && [ "$(cat "$VENV/checkov/.installed" 2>/dev/null)" != "$CHECKOV_VERSION" ]; then
  echo "setup: installing checkov $CHECKOV_VERSION into $VENV/checkov" >&2
  "$PY" -m venv "$VENV/checkov"
  install "$VENV/checkov/bin/python" "checkov==$CHECKOV_VERSION"
  echo "$CHECKOV_VERSION" > "$VENV/checkov/.installed"
fi
export PATH="$VENV/bin:$PATH"
