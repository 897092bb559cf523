#!/usr/bin/env bash
# What a leased GPU machine (Python 3.12, torch 2.11, no network) needs beyond its image to
# run this checkout's GPU harnesses, packed under the git-ignored .device/kit/ so a device
# call can carry it:
#   .device/kit/whl312/common/  dependency wheels every SGLang layer run imports (cp312)
#   .device/kit/whl312/s510/    sglang 0.5.10.post1's own pins that differ (transformers)
#   .device/kit/whl312/s523/    sglang 0.5.23's (transformers, msgspec, ...)
#   .device/kit/<stack>/        that stack's built wheels (wheels/<stack>/, with manifest.json)
#   .device/kit/<stack>/upstream/  the stock FlashInfer wheel of the stack's pin (A/B baseline)
# Wheels larger than one call can carry (sglang 0.5.23's cp312, flashinfer 0.7.2) travel as
# their unpacked trees, xz-compressed, without compiled extensions (<wheel>.dropped.txt lists
# them), with the RECORD's sha256 (<wheel>.record.sha256) to check the tree against there.
# Usage: bash benchmarks/gpu_kit.sh [stack ...]   (after `nox -s build -- --stack <stack>`)
set -euo pipefail
cd "$(dirname "$0")/.."
K=.device/kit
PY312=(--no-deps --only-binary=:all: --python-version 3.12 --implementation cp
       --platform manylinux_2_34_x86_64 --platform manylinux_2_31_x86_64
       --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64
       --platform manylinux_2_26_x86_64 --platform manylinux_2_24_x86_64
       --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64
       --platform manylinux1_x86_64)
fetch() { local dir=$1; shift; mkdir -p "$dir"; python3 -m pip download -q "${PY312[@]}" -d "$dir" "$@"; }
# Versions: the sglang-probe group's pins (pyproject.toml) where it has them; the rest are
# what those pins require and the GPU image lacks (its package list: the device tool's KINDS.md).
fetch $K/whl312/common apache-tvm-ffi==0.1.15.post2 cuda-tile==1.7.0 openai==2.6.1 \
  pybase64==1.5.1 pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 \
  typing-inspection==0.4.5 typing-extensions==4.16.0 orjson==3.13.0 starlette==1.10.0 \
  partial-json-parser==0.2.1.1.post7 pyzmq==27.3.0 dill==0.4.1 compressed-tensors==0.20.1 \
  loguru==0.7.3 gguf==0.19.0 jiter==0.19.0 distro==1.9.0 sniffio==1.3.1
# sglang/utils.py imports IPython.display at import time: ipython and what it imports
fetch $K/whl312/common ipython==9.18.1 ipython-pygments-lexers==1.1.1 traitlets==5.14.3 \
  jedi==0.19.2 parso==0.8.5 prompt-toolkit==3.0.52 wcwidth==0.2.14 pexpect==4.9.0 ptyprocess==0.7.0 \
  decorator==5.2.1 matplotlib-inline==0.2.1 stack-data==0.6.3 executing==2.2.1 asttokens==3.0.0 \
  pure-eval==0.2.3
# transformers 5.3.0 accepts tokenizers <= 0.23.0; the GPU image has 0.23.2
fetch $K/whl312/s510 transformers==5.3.0 tokenizers==0.22.2
fetch $K/whl312/s523 transformers==5.19.0 msgspec==0.23.0 fastapi==0.165.0 uvicorn==0.54.0 \
  opentelemetry-api==1.45.2
for stack in "$@"; do
  src=wheels/$stack
  [ -f "$src/manifest.json" ] || { echo "no build of $stack: nox -s build -- --stack $stack" >&2; exit 2; }
  rm -rf "${K:?}/$stack"; mkdir -p "$K/$stack/upstream"
  cp "$src/manifest.json" "$src/constraints.txt" "$K/$stack/"
  [ -d "$src/plugin" ] && cp -r "$src/plugin" "$K/$stack/"
  for whl in "$src"/*.whl; do
    case $whl in
      *-cp312-*x86_64.whl|*py3-none-any.whl) ;;
      *) continue ;;  # other Pythons and platforms stay behind
    esac
    if [ "$(stat -c %s "$whl")" -gt 20000000 ]; then
      t=$(mktemp -d); python3 -m pip install -q --target "$t/tool" wheel >/dev/null && PYTHONPATH="$t/tool" python3 -m wheel unpack -d "$t" "$whl" >/dev/null
      rm -rf "$t/tool"; name=$K/$stack/$(basename "$whl" .whl)
      # compiled extensions stay behind (the layer harnesses import none; sglang 0.5.23's
      # are 46 of its 123 MB): listed, with the RECORD's sha256 for the check there
      (cd "$t" && find . -name '*.so' -printf '%P\n' | sort > "$OLDPWD/$name.dropped.txt" && find . -name '*.so' -delete)
      sha256sum "$t"/*/*.dist-info/RECORD | cut -d' ' -f1 > "$name.record.sha256"
      tar -C "$t" -cf - . | xz -9 -T2 > "$name.tree.tar.xz"; rm -rf "$t"
    else
      cp "$whl" "$K/$stack/"
    fi
  done
  # The stock FlashInfer of the stack's pin, for the A/B (skipped where the stack ships it
  # as published: then the built folder already holds upstream's wheel).
  python3 - "$stack" "$K/$stack/upstream" <<'PY'
import json, sys, subprocess
stack, dest = sys.argv[1], sys.argv[2]
m = json.load(open(f"wheels/{stack}/manifest.json"))
for w in m.get("wheels", []):
    if w.get("project") == "flashinfer" and not w.get("used_as_published"):
        v = w["upstream_version"]
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps",
                        "--only-binary=:all:", "-d", dest, f"flashinfer-python=={v}"], check=True)
PY
done
du -sh $K/* $K/*/* 2>/dev/null | sort -k2
