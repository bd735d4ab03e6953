# Sourced by call.sh and call_grow.sh: slim_export RUN_DIR OUT_DIR NAME packs RUN_DIR/tiny as OUT_DIR/tiny-slim.tgz,
# leaving out the weight files byte-identical to h3/assets/tiny's (rebuild.sh copies them back), with export.sha256
# of the whole export. Run from the repository root.
slim_export() {
  local r=$1 o=$2 n=$3 f
  [ -d "$r/tiny" ] || return 0
  (cd "$r" && find tiny -type f | sort | xargs sha256sum) >"$r/export.sha256"
  local ex=()
  for f in vae/diffusion_pytorch_model.safetensors text_encoder/model.safetensors \
    audio_vae/diffusion_pytorch_model.safetensors; do
    cmp -s "$r/tiny/$f" "h3/assets/tiny/$f" && ex+=("--exclude=tiny/$f")
  done
  tar -C "$r" "${ex[@]}" -czf "$o/tiny-slim.tgz" tiny export.sha256
  echo "$n: export left out as shipped: ${ex[*]:-nothing}"
}
