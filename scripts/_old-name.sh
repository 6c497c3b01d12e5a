# Sourced by scripts/demo.sh and scripts/dev-install.sh, with ROOT the checkout and .venv in it.
# The distribution was called agent-work-layer until it took a name of its own (that name on
# PyPI is the published AWL package): an editable install of this checkout under the old
# name goes first, so one distribution owns the awl command.
if "$ROOT/.venv/bin/python" -m pip show agent-work-layer 2>/dev/null \
    | grep -qx "Editable project location: $ROOT"; then
  "$ROOT/.venv/bin/python" -m pip uninstall -q -y --disable-pip-version-check agent-work-layer
fi
