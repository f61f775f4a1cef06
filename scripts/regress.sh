#!/usr/bin/env bash
# Golden SQL tests (tests/regress): scripts/golden.sh regress [TEST...].
exec "$(dirname "$0")/golden.sh" regress "$@"
