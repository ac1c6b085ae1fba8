# hopper-reaper: kills the process groups of a worker's units, and removes
# its private directories, once the worker is gone, however it went (even
# SIGKILL). The worker writes "+ PGID" when a unit's group starts, "- PGID"
# when it has ended, and "rm DIR" for a directory to remove, on this
# process's stdin; the worker's death closes that pipe, and awk's input ends.
# awk, not a shell loop: a shell's `read` takes a pipe one byte per system
# call, about 20 µs of CPU for every unit a worker started.
$1 == "+" && $2 ~ /^[0-9]+$/ && $2 + 0 > 1 { groups[$2] = 1; next }
$1 == "-" { delete groups[$2]; next }
$1 == "rm" && substr($0, 4, 1) == "/" { dirs[substr($0, 4)] = 1; next }
END {
    kill = "while read -r pgid; do kill -s KILL -- \"-$pgid\" 2>/dev/null; done"
    for (pgid in groups) print pgid | kill
    close(kill)
    remove = "while IFS= read -r dir; do rm -rf -- \"$dir\"; done"
    for (dir in dirs) print dir | remove
    close(remove)
}
