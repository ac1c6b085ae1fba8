# Passes: string handling works.
s="hopper"
test "${#s}" -eq 6
echo "len(hopper) = 6"
