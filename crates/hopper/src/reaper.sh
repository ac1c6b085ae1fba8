# hopper's reaper: kills the process groups of a worker's units once the
# worker is gone, however it went (even SIGKILL). The worker writes "+ PGID"
# when a unit's group starts and "- PGID" when it has ended on this process's
# stdin; the worker's death closes that pipe, and `read` sees the end.
groups=" "
while read -r op pgid; do
    case "$op" in
        +) groups="$groups$pgid " ;;
        -) case "$groups" in
               *" $pgid "*) groups="${groups%% "$pgid" *} ${groups#* "$pgid" }" ;;
           esac ;;
    esac
done
for pgid in $groups; do
    kill -s KILL -- "-$pgid" 2>/dev/null
done
