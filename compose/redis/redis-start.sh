# Starts one Redis server of a replicated shard: `sh redis-start.sh redis-server ARGS...`.
# Environment: SHARD (the master name the Sentinels monitor: the node id), SELF (this
# server's stable host name, announced to the primary and so to the Sentinels),
# FIRST_PRIMARY (host of the shard's primary on a fresh start) and SENTINELS
# (host:port ...). Shared by compose/docker-compose.yml and compose/kubernetes/.
#
# The role comes from the Sentinels when one of them answers: a server restarted after
# a failover rejoins as a replica of the promoted one instead of claiming the primary
# role back. Only when no Sentinel knows the shard yet (the very first start) does
# FIRST_PRIMARY start as the primary and every other server as its replica.
set -eu
set -f
primary=""
port=6379
for sentinel in $SENTINELS; do
  answer=$(timeout 2 redis-cli -h "${sentinel%:*}" -p "${sentinel##*:}" --raw \
    sentinel get-master-addr-by-name "$SHARD" 2>/dev/null) || continue
  host=$(printf '%s\n' "$answer" | sed -n 1p)
  found=$(printf '%s\n' "$answer" | sed -n 2p)
  case "$found" in '' | *[!0-9]*) continue ;; esac
  if [ -n "$host" ]; then
    primary=$host
    port=$found
    break
  fi
done
if [ -z "$primary" ]; then
  primary=$FIRST_PRIMARY
  echo "redis-start: no Sentinel knows $SHARD yet: $FIRST_PRIMARY is its primary" >&2
else
  echo "redis-start: the Sentinels name $primary:$port the primary of $SHARD" >&2
fi
if [ "$primary" != "$SELF" ]; then
  set -- "$@" --replicaof "$primary" "$port"
fi
exec "$@" --replica-announce-ip "$SELF"
