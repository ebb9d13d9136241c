#!/usr/bin/env bash
# Device side of bench/gpu/stage.sh: keep the staged part(s) this call carries where later calls find
# them (/tmp survives between calls while the machine stays warm, 30 s after each call).
set -euo pipefail
cd "$(dirname "$0")/../.."
STAGE=${JETSPEC_STAGE:-/tmp/jetspec-stage}
mkdir -p "$STAGE"
shopt -s nullglob
files=(.stage/p*/*)
[ ${#files[@]} -gt 0 ] || { echo "receive.sh: this call carries no .stage/pNN folder" >&2; exit 2; }
cp "${files[@]}" "$STAGE"/
ls -l "$STAGE"
