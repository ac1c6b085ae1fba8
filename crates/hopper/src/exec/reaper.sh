# hopper's reaper: kills the process groups of a worker's units, and removes
# its private directories, once the worker is gone, however it went (even
# SIGKILL). The worker writes "+ PGID" when a unit's group starts, "- PGID"
# when it has ended, and "rm DIR" for a directory to remove, on this
# process's stdin; the worker's death closes that pipe, and `read` sees the end.
groups=" "
dirs=""
while IFS= read -r line; do
    op=${line%% *}
    arg=${line#* }
    case "$op" in
        +) groups="$groups$arg " ;;
        -) case "$groups" in
               *" $arg "*) groups="${groups%% "$arg" *} ${groups#* "$arg" }" ;;
           esac ;;
        rm) dirs="$dirs$arg
" ;;
    esac
done
for pgid in $groups; do
    kill -s KILL -- "-$pgid" 2>/dev/null
done
printf '%s' "$dirs" | while IFS= read -r dir; do
    case "$dir" in
        /*) rm -rf -- "$dir" ;;
    esac
done
