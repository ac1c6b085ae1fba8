#!/bin/sh
# Runs one unit of the hopper demo suite: a small shell "test" file.
# hopper sets HOPPER_ATTEMPT (1 on the first attempt, 2 on the first retry).
set -eu
unit="$1"
echo "running $unit (attempt ${HOPPER_ATTEMPT:-1})"
. "$unit"
