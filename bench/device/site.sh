# Sourced by the device drivers that carry .whl_prod (runtime_speed.sh, gate_fraction.sh): `unpack_site PY` unpacks
# .whl_prod/site.tar.xz (diffusers 0.42.1, pydantic, PyAV: bench/runtime_speed/pack_site.sh) into /tmp/site and installs
# there every wheel carried beside it (.whl_prod/*.whl: e.g. sageattention for sm_90 from build_sageattention.sh).
unpack_site() {
  local py=$1 w
  mkdir -p /tmp/site
  tar -xJf .whl_prod/site.tar.xz -C /tmp/site || { echo "no .whl_prod/site.tar.xz"; return 1; }
  for w in .whl_prod/*.whl; do
    [ -f "$w" ] && "$py" -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$w" && echo "installed $w"
  done
  return 0
}
