#!/usr/bin/env bash
# Stamps the extension's SQL scripts with the major they were built for.
#   scripts/stamp-major.sh MAJOR FILE...
# Prepends to each `alkblobs--*.sql` FILE (once: a stamped file is left as
# it is) a check that the server running it is PostgreSQL MAJOR. Every
# script loads the library (its C functions), and a library built for
# another major fails to load with the dynamic linker's words (`undefined
# symbol: GetMemoryChunkContext`, a 17 build on 15); the check runs first
# and says instead which major the files are for, which the server is, and
# what to install. scripts/install-extension.sh and scripts/package.sh run
# it on what they install; the scripts in sql/ stay as they are.
set -euo pipefail
cd "$(dirname "$0")/.."
major=${1:?usage: $0 MAJOR FILE...}
shift
shipped=$(scripts/postgres.sh majors | sed 's/ /, /g; s/, \([0-9]*\)$/ and \1/')
for f in "$@"; do
    if head -n 1 "$f" | grep -q '^-- alkblobs: built for PostgreSQL'; then
        continue
    fi
    tmp=$(mktemp "$f.XXXXXX")
    {
        echo "-- alkblobs: built for PostgreSQL $major (scripts/stamp-major.sh)"
        cat <<SQL
DO \$alkblobs_major\$
BEGIN
    IF pg_catalog.current_setting('server_version_num')::integer / 10000 <> $major THEN
        RAISE EXCEPTION 'alkblobs: these files were built for PostgreSQL $major, and this server is PostgreSQL %', pg_catalog.current_setting('server_version')
            USING ERRCODE = 'feature_not_supported',
                  HINT = 'Install the build for this server''s major (the package postgresql-'
                         || pg_catalog.current_setting('server_version_num')::integer / 10000
                         || '-alkblobs, or scripts/install-extension.sh with that major); alkblobs is built for PostgreSQL $shipped.';
    END IF;
END
\$alkblobs_major\$;
SQL
        cat "$f"
    } > "$tmp"
    chmod --reference="$f" "$tmp"
    mv "$tmp" "$f"
done
