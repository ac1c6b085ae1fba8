# Passes: arithmetic works.
test "$((6 * 7))" -eq 42
echo "6 * 7 = 42"
