# Flaky: fails on its first attempt, passes on the retry. The report lists it
# as flaky and the build still passes.
if [ "${HOPPER_ATTEMPT:-1}" = 1 ]; then
  echo "simulated flake: connection reset (first attempt)" >&2
  exit 1
fi
echo "passed on attempt $HOPPER_ATTEMPT"
