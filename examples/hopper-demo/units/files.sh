# Passes: a temporary file round-trips.
tmp=$(mktemp)
echo hello > "$tmp"
test "$(cat "$tmp")" = hello
rm -f "$tmp"
