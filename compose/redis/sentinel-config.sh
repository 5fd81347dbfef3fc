# Writes a Sentinel's configuration file: `sh sentinel-config.sh TEMPLATE OUTPUT`.
# Environment: SELF (this Sentinel's stable host name) and SENTINELS (host:port of every
# Sentinel, this one included). Shared by compose/docker-compose.yml and
# compose/kubernetes/.
#
# A Sentinel rewrites its own file as it learns (replicas, other Sentinels, promotions),
# so it gets a writable copy of TEMPLATE with three changes:
#  - each `sentinel monitor NAME HOST PORT QUORUM` names the primary that the other
#    Sentinels know now, if one answers (a Sentinel started after a failover must not
#    monitor the demoted primary); else, if TEMPLATE's HOST is a replica whose primary
#    answers as one (every Sentinel restarted after a failover), that primary;
#    otherwise TEMPLATE's HOST PORT (a fresh shard);
#  - `sentinel myid` derived from SELF: the same id across restarts, so the other
#    Sentinels never count a restarted one twice (the failover majority is taken over
#    every Sentinel they know);
#  - `sentinel announce-ip SELF`: known to the others by name, not by a changing IP.
set -eu
set -f
template=$1
output=$2
tmp="$output.tmp"
: >"$tmp"
while IFS= read -r line || [ -n "$line" ]; do
  # shellcheck disable=SC2086  # split the line into its words
  set -- $line
  if [ "$#" -eq 6 ] && [ "$1" = sentinel ] && [ "$2" = monitor ]; then
    found=""
    for sentinel in $SENTINELS; do
      [ "${sentinel%:*}" = "$SELF" ] && continue
      answer=$(timeout 2 redis-cli -h "${sentinel%:*}" -p "${sentinel##*:}" --raw \
        sentinel get-master-addr-by-name "$3" 2>/dev/null) || continue
      host=$(printf '%s\n' "$answer" | sed -n 1p)
      port=$(printf '%s\n' "$answer" | sed -n 2p)
      case "$port" in '' | *[!0-9]*) continue ;; esac
      if [ -n "$host" ]; then
        echo "sentinel-config: $3 is at $host:$port (asked $sentinel)" >&2
        line="sentinel monitor $3 $host $port $6"
        found=yes
        break
      fi
    done
    if [ -z "$found" ]; then
      role=$(timeout 2 redis-cli -h "$4" -p "$5" --raw role 2>/dev/null) || role=""
      host=$(printf '%s\n' "$role" | sed -n 2p)
      port=$(printf '%s\n' "$role" | sed -n 3p)
      case "$(printf '%s\n' "$role" | sed -n 1p):$port" in
        slave: | slave:*[!0-9]*) ;;
        slave:*)
          if [ -n "$host" ] && [ "$(timeout 2 redis-cli -h "$host" -p "$port" --raw role \
            2>/dev/null | sed -n 1p)" = master ]; then
            echo "sentinel-config: $3 is at $host:$port (the primary of $4)" >&2
            line="sentinel monitor $3 $host $port $6"
          fi
          ;;
      esac
    fi
  fi
  printf '%s\n' "$line" >>"$tmp"
done <"$template"
myid=$(printf '%s' "$SELF" | sha1sum | cut -c1-40)
printf 'sentinel myid %s\nsentinel announce-ip %s\n' "$myid" "$SELF" >>"$tmp"
mv "$tmp" "$output"
