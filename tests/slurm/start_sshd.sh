#!/usr/bin/env bash
# An sshd on 127.0.0.1 for the Slurm-over-SSH test: installs openssh-server from Debian if
# needed, makes a host key and a client key under $STATE, listens on $PORT, lets the client
# key in as root. Idempotent. Prints "PORT KEYFILE". Exit 3: cannot run here (not root, no apt).
set -euo pipefail
STATE=/var/lib/onepool-slurm/sshd
PORT=${SSHD_PORT:-22514}
say() { echo "start_sshd: $*" >&2; }
[ "$(id -u)" = 0 ] || { say "needs root"; exit 3; }
if [ ! -x /usr/sbin/sshd ]; then
    say "installing openssh-server from Debian"
    export DEBIAN_FRONTEND=noninteractive
    install() { apt-get install -y -qq --no-install-recommends openssh-server; }
    { install || { apt-get update -qq && install; }; } >/tmp/onepool-sshd-apt.log 2>&1 \
        || { say "apt-get failed (see /tmp/onepool-sshd-apt.log)"; exit 3; }
fi
mkdir -p "$STATE" /run/sshd && chmod 700 "$STATE"
[ -s "$STATE/host_ed25519" ] || ssh-keygen -q -t ed25519 -N "" -f "$STATE/host_ed25519"
[ -s "$STATE/client_ed25519" ] || ssh-keygen -q -t ed25519 -N "" -f "$STATE/client_ed25519"
cp "$STATE/client_ed25519.pub" "$STATE/authorized_keys" && chmod 600 "$STATE/authorized_keys"
cat >"$STATE/sshd_config" <<CONF
ListenAddress 127.0.0.1
Port $PORT
HostKey $STATE/host_ed25519
AuthorizedKeysFile $STATE/authorized_keys
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
PidFile $STATE/sshd.pid
CONF
pid=$(cat "$STATE/sshd.pid" 2>/dev/null || true)
if [ -z "$pid" ] || [ ! -r "/proc/$pid/stat" ] || [ "$(awk '{print $3}' "/proc/$pid/stat")" = Z ]; then
    /usr/sbin/sshd -f "$STATE/sshd_config" || { say "sshd did not start"; exit 3; }
fi
for _ in $(seq 50); do
    if ssh -o BatchMode=yes -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR \
        -i "$STATE/client_ed25519" -p "$PORT" root@127.0.0.1 true 2>/dev/null; then
        echo "$PORT $STATE/client_ed25519"
        exit 0
    fi
    sleep 0.1
done
say "cannot log in to 127.0.0.1:$PORT"
exit 3
