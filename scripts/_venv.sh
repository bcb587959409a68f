# Sourced by scripts/dnntune and scripts/test: make sure the project venv exists and is current.
#
# - The venv is <repo>/.venv (override with VENV_DIR), made with the python3 on PATH (override
#   with PYTHON); it needs Python 3.11 or newer.
# - torch==2.13.0 is installed FIRST and pinned: pip then takes the CPU build that lies on local
#   disk (pip's find-links), and the package's own "torch>=2.4" is already satisfied, so no
#   multi-GB CUDA build is ever pulled in. Set TORCH_INDEX_URL (for example the PyTorch CPU
#   wheel index) on a machine without that local file.
# - `pip install -e '.[dev]'` runs only when pyproject.toml changed since the last install (a
#   stamp in the venv keyed by its hash), so a second run starts at once.

_dnntune_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV_DIR="${VENV_DIR:-$_dnntune_root/.venv}"
_dnntune_torch="2.13.0"

_dnntune_say() { printf '[dnntune setup] %s\n' "$*" >&2; }

_dnntune_python="${PYTHON:-python3}"
if ! command -v "$_dnntune_python" >/dev/null 2>&1; then
    _dnntune_say "error: $_dnntune_python not found; install Python 3.11+ or set PYTHON"
    exit 1
fi

if [ ! -x "$VENV_DIR/bin/python" ]; then
    if ! "$_dnntune_python" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
        _dnntune_say "error: $("$_dnntune_python" --version 2>&1) is too old; dnntune needs 3.11+"
        exit 1
    fi
    _dnntune_say "creating $VENV_DIR"
    "$_dnntune_python" -m venv "$VENV_DIR"
fi

_dnntune_stamp="$VENV_DIR/.dnntune-install-stamp"
_dnntune_want="$( (cat "$_dnntune_root/pyproject.toml"; echo "torch==$_dnntune_torch") \
    | "$VENV_DIR/bin/python" -c 'import hashlib, sys; print(hashlib.sha256(sys.stdin.buffer.read()).hexdigest())')"

if [ "$(cat "$_dnntune_stamp" 2>/dev/null || true)" != "$_dnntune_want" ] \
    || ! "$VENV_DIR/bin/python" -c 'import dnntune' >/dev/null 2>&1; then
    _dnntune_pip=("$VENV_DIR/bin/python" -m pip install --quiet --quiet --disable-pip-version-check)
    if ! "$VENV_DIR/bin/python" -c "import sys, torch; sys.exit(torch.__version__.split('+')[0] != '$_dnntune_torch')" >/dev/null 2>&1; then
        _dnntune_say "installing torch==$_dnntune_torch (CPU build) first"
        if [ -n "${TORCH_INDEX_URL:-}" ]; then
            "${_dnntune_pip[@]}" --index-url "$TORCH_INDEX_URL" "torch==$_dnntune_torch"
        else
            "${_dnntune_pip[@]}" "torch==$_dnntune_torch"
        fi
    fi
    _dnntune_say "installing dnntune (editable) with its dev tools"
    "${_dnntune_pip[@]}" -e "$_dnntune_root[dev]"
    printf '%s\n' "$_dnntune_want" > "$_dnntune_stamp"
fi
