# Sourced by the device scripts: installs the wheels of $KIT/whl (made by
# scripts/device_kit.sh) into /tmp/site without network, puts it and the
# checkout on PYTHONPATH and shows the devices JAX sees; returns 1 on failure,
# JAX left on the CPU (a CUDA plugin that failed to load) included.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
  --upgrade --target /tmp/site "$KIT"/whl/*.whl || return 1
export PYTHONPATH=/tmp/site:$PWD
python3 -c "import jax; print('jax', jax.__version__, jax.devices())
assert jax.default_backend() == 'gpu', 'JAX is not on the GPU'" || return 1
