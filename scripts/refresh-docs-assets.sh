#!/usr/bin/env bash
# Refresh the API-docs assets the service ships (service/static/docs/, served at /docs and
# /redoc by service/docs_pages.py): Swagger UI from npm's swagger-ui-dist and Redoc's standalone
# bundle from npm's redoc, with their licence files. Run by hand, at development time, then
# commit the result; the service never fetches anything at run time.
#
#   bash scripts/refresh-docs-assets.sh [SWAGGER_UI_VERSION] [REDOC_VERSION]
#
# Packages are fetched with `npm pack` (the tarball only: no install, no install scripts, so
# swagger-ui-dist's @scarf/scarf dependency and its install-time analytics never run). The files
# are copied verbatim and their SHA-256 sums written to SHA256SUMS, which
# tests/service/test_docs_pages.py checks. Redoc 3 reports telemetry to otel.cloud.redocly.com and
# loads icons from a CDN: stay on Redoc 2 unless the test of /redoc still passes with a newer one.
set -euo pipefail

SWAGGER_UI=${1:-5.35.0}
REDOC=${2:-2.5.4}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
DEST="$ROOT/service/static/docs"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

cd "$WORK"
npm pack --silent "swagger-ui-dist@$SWAGGER_UI" "redoc@$REDOC" >/dev/null
mkdir swagger-ui redoc
tar xzf "swagger-ui-dist-$SWAGGER_UI.tgz" -C swagger-ui --strip-components=1
tar xzf "redoc-$REDOC.tgz" -C redoc --strip-components=1

mkdir -p "$DEST/swagger-ui" "$DEST/redoc"
for f in swagger-ui-bundle.js swagger-ui.css swagger-ui-bundle.js.LICENSE.txt LICENSE NOTICE; do
    cp "swagger-ui/$f" "$DEST/swagger-ui/$f"
done
for f in bundles/redoc.standalone.js bundles/redoc.standalone.js.LICENSE.txt LICENSE; do
    cp "redoc/$f" "$DEST/redoc/$(basename "$f")"
done

cd "$DEST"
{
    echo "# npm packages: swagger-ui-dist@$SWAGGER_UI redoc@$REDOC (scripts/refresh-docs-assets.sh)"
    sha256sum swagger-ui/* redoc/*
} > SHA256SUMS
echo "service/static/docs: swagger-ui-dist $SWAGGER_UI, redoc $REDOC; update the versions in its README.md"
