#!/usr/bin/env bash
# Writes the compile-time query cache (.sqlx/) again after a query or a migration changed.
#
# Every statement in src/store is a sqlx query macro, checked against the schema when it is
# compiled. Builds read the cache (.cargo/config.toml sets SQLX_OFFLINE=true), so neither CI nor
# a new machine needs a database to compile; this script is the one step that talks to one: it
# migrates a scratch database with migrations/, expands every macro against it and keeps what
# each statement was found to read and bind. tests/stored_queries.rs checks the cache against a
# freshly migrated database on every test run.
#
# Usage: scripts/sqlx-prepare.sh   (PostgreSQL on 127.0.0.1:5432, user postgres, as for the tests;
#        APTIX_SQLX_ADMIN_URL overrides the server, e.g. postgres://me:pw@db:5432)
set -euo pipefail
cd "$(dirname "$0")/.."

admin=${APTIX_SQLX_ADMIN_URL:-postgres://postgres@127.0.0.1:5432}
db=aptix_sqlx_prepare
psql "$admin/postgres" -qAt -v ON_ERROR_STOP=1 \
  -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" -c "CREATE DATABASE $db"
# The migrations as the pipeline applies them: each file in order, in a transaction of its own.
for f in migrations/*.sql; do
  psql "$admin/$db" -qAt -v ON_ERROR_STOP=1 --single-transaction -f "$f" >/dev/null
done

fresh=$(mktemp -d "${TMPDIR:-/tmp}/aptix-sqlx.XXXXXX")
trap 'rm -rf "$fresh"' EXIT
# Touched so that cargo expands the macros again even when nothing else changed.
touch src/lib.rs
DATABASE_URL="$admin/$db" SQLX_OFFLINE=false SQLX_OFFLINE_DIR="$fresh" \
  cargo check --quiet -p aptix --lib
rm -rf .sqlx
mkdir .sqlx
cp "$fresh"/query-*.json .sqlx/
psql "$admin/postgres" -qAt -c "DROP DATABASE IF EXISTS $db WITH (FORCE)"
echo "sqlx-prepare: $(ls .sqlx | wc -l) statements in .sqlx/"
