#!/usr/bin/env bash
# Isolation specs (tests/isolation): scripts/golden.sh isolation [SPEC...].
exec "$(dirname "$0")/golden.sh" isolation "$@"
