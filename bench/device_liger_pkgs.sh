#!/usr/bin/env bash
# Build .ligerpkgs/ (git-ignored) in the repository root: the liger-kernel wheel for the lent GPU
# machine, which has torch 2.11 + cu130 and triton (Liger's only runtime dependencies) but not
# Liger, and no network. Carry it beside .devpkgs (the wheel is ~1 MB):
#   bash bench/device_liger_pkgs.sh                      # here, once
#   carry [".devpkgs", ".ligerpkgs"]; on the device:
#   bash .devpkgs/install.sh && bash .ligerpkgs/install.sh && export PYTHONPATH=/tmp/site:$PWD
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
out=.ligerpkgs
LIGER=${LIGER:-liger-kernel==0.8.5}
mkdir -p "$out"
rm -f "$out"/*.whl
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 -d "$out" "$LIGER"
cat > "$out/install.sh" <<'INSTALL'
#!/usr/bin/env bash
# Runs on the GPU machine: liger-kernel into /tmp/site, without its dependencies (torch and
# triton are the image's; pip must not replace them). Once per warm machine.
set -e
here=$(cd "$(dirname "$0")" && pwd)
if [ ! -f /tmp/site/.liger_done ]; then
  mkdir -p /tmp/site
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site "$here"/*.whl
  touch /tmp/site/.liger_done
fi
# a failed import is reported, not fatal: the bench's liger rows then say liger=no
PYTHONPATH=/tmp/site python3 -c "import liger_kernel.transformers as l; print('liger ok', l.apply_liger_kernel_to_qwen2.__name__)" \
  || echo 'liger-kernel does not import here (above): trainer.liger rows will run without it'
INSTALL
chmod +x "$out/install.sh"
du -sh "$out"; ls "$out"
