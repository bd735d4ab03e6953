#!/usr/bin/env bash
# The whole exported checkpoint from call.sh's tiny-slim.tgz: unpack it into DEST, copy back from h3/assets/tiny the
# weight files the device found byte-identical to the shipped ones, and check every file against export.sha256.
#
#   bash bench/tiny_wider_dit/rebuild.sh RETURNED/<n>/tiny-slim.tgz DEST     # DEST/tiny is the checkpoint folder
set -eu
src=$1
dest=$2
mkdir -p "$dest"
if [ -e "$dest/tiny" ]; then
  echo "$dest/tiny exists; give an empty DEST" >&2
  exit 3
fi
tar -C "$dest" -xzf "$src"
for f in vae/diffusion_pytorch_model.safetensors text_encoder/model.safetensors \
  audio_vae/diffusion_pytorch_model.safetensors; do
  [ -e "$dest/tiny/$f" ] || { mkdir -p "$(dirname "$dest/tiny/$f")" && cp "h3/assets/tiny/$f" "$dest/tiny/$f"; }
done
(cd "$dest" && sha256sum --quiet -c export.sha256) || { echo "$dest/tiny does not match export.sha256" >&2; exit 1; }
echo "$dest/tiny: rebuilt, $(wc -l <"$dest/export.sha256") files match export.sha256"
