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
# Reinstall only when pyproject.toml or the requested extra changed.
STAMP="$VENV/.lowlevel-installed"
WANT="$(cat "$ROOT/pyproject.toml" | sha256sum | cut -c1-16)-$EXTRA"
if [ "$(cat "$STAMP" 2>/dev/null)" != "$WANT" ]; then
  echo "setup: installing lowlevel${EXTRA:+[$EXTRA]} and its dependencies (TensorFlow is large; first time only)" >&2
  "$VENV/bin/python" -m pip install -q --upgrade pip >&2
  "$VENV/bin/python" -m pip install -q -e "$ROOT${EXTRA:+[$EXTRA]}" >&2
  echo "$WANT" > "$STAMP"
fi
# The test extra also gets checkov (a Kubernetes manifest scanner, tests/test_k8s.py) in a
# venv of its own inside .venv: its many pinned dependencies stay out of the project's.
CHECKOV_VERSION="3.3.30"
if [ "$EXTRA" = "test" ] && [ "$(cat "$VENV/checkov/.installed" 2>/dev/null)" != "$CHECKOV_VERSION" ]; then
  echo "setup: installing checkov $CHECKOV_VERSION into $VENV/checkov" >&2
  "$PY" -m venv "$VENV/checkov"
  "$VENV/checkov/bin/python" -m pip install -q "checkov==$CHECKOV_VERSION" >&2
  echo "$CHECKOV_VERSION" > "$VENV/checkov/.installed"
fi
export PATH="$VENV/bin:$PATH"
