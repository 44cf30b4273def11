#!/usr/bin/env bash
# Builds two engines' own drafters on a CPU into .engines/ (git-ignored), for tests/test_engine_drafters.py to
# compare our sources with (those tests skip, with a sentence, without them):
#   - vLLM's suffix drafter: Arctic Inference's suffix tree (csrc/suffix_decoding), from its PyPI source;
#   - SGLang's NGRAM drafter: the n-gram corpus (kernels/jit/csrc/ngram_corpus) of SGLang's PyPI wheel, with our
#     binding (tests/engines/sglang_ngram.cc) in place of SGLang's tvm-ffi layer.
# The versions are the ones the sources name.  Needs cmake >= 3.18 and a C++20 compiler; about 2 minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
OUT=$ROOT/.engines
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
PIP=(python -m pip --disable-pip-version-check --quiet)
"${PIP[@]}" install "nanobind>=2.4,<4"
# Arctic Inference is a source release only, and pip would build its metadata against a torch of its own: fetch the
# file itself from PyPI, checked against PyPI's sha256.
python - "$WORK" <<'PY'
import hashlib, re, sys, urllib.request
name = "arctic_inference-0.3.0.tar.gz"
index = urllib.request.urlopen("https://pypi.org/simple/arctic-inference/", timeout=60).read().decode()
url, sha256 = re.search(rf'href="([^"#]+/{re.escape(name)})#sha256=([0-9a-f]+)"', index).groups()
data = urllib.request.urlopen(url, timeout=300).read()
if hashlib.sha256(data).hexdigest() != sha256:
    sys.exit(f"{name}: its sha256 is not PyPI's")
with open(f"{sys.argv[1]}/{name}", "wb") as f:
    f.write(data)
PY
"${PIP[@]}" download --no-deps --only-binary :all: "sglang==0.5.23" -d "$WORK"
tar -xzf "$WORK"/arctic_inference-0.3.0.tar.gz -C "$WORK"
python -m zipfile -e "$WORK"/sglang-0.5.23-*.whl "$WORK/sglang"
rm -rf "$OUT" && mkdir -p "$OUT/arctic_inference"

ARCTIC=$WORK/arctic_inference-0.3.0
cmake -S "$ARCTIC/csrc/suffix_decoding" -B "$WORK/build-arctic" -DPython_EXECUTABLE="$(command -v python)" >/dev/null
cmake --build "$WORK/build-arctic" -j 2 >/dev/null
cp -r "$ARCTIC/arctic_inference/suffix_decoding" "$OUT/arctic_inference/"
cp "$WORK"/build-arctic/_C*.so "$OUT/arctic_inference/suffix_decoding/"
cp "$ARCTIC/LICENSE" "$OUT/arctic_inference/"
touch "$OUT/arctic_inference/__init__.py"  # the suffix module alone, not the package's vLLM plugin

cmake -S tests/engines -B "$WORK/build-sglang" -DPython_EXECUTABLE="$(command -v python)" \
  -DSGLANG_NGRAM_DIR="$WORK/sglang/sglang/kernels/jit/csrc/ngram_corpus" >/dev/null
cmake --build "$WORK/build-sglang" -j 2 >/dev/null
cp "$WORK"/build-sglang/sglang_ngram*.so "$OUT/"
echo "built into .engines/: arctic_inference.suffix_decoding (0.3.0), sglang_ngram (SGLang 0.5.23)"
