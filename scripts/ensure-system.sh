#!/usr/bin/env bash
# What the tests need from the machine besides Python packages: Debian's chromium for the
# dashboard test, Debian's nginx (the load balancer in front of replicas), a running PostgreSQL on
# 127.0.0.1:5432 that the postgres role can use, and a running Redis on 127.0.0.1:6379 (the broker).
set -euo pipefail

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
apt_updated=""
apt_install() {
  if [ -z "$apt_updated" ]; then $SUDO apt-get update -q; apt_updated=1; fi
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q "$@"
}

if ! command -v chromium >/dev/null 2>&1; then
  echo "ensure-system: installing Debian's chromium (dashboard test)"
  apt_install chromium
fi

if ! command -v nginx >/dev/null 2>&1 && [ ! -x /usr/sbin/nginx ]; then
  echo "ensure-system: installing Debian's nginx (replica tests)"
  apt_install nginx-light || apt_install nginx
fi

pg_ready() { pg_isready -q -h 127.0.0.1 -p 5432 >/dev/null 2>&1; }
if ! pg_ready; then
  fresh=""
  if ! command -v pg_ctlcluster >/dev/null 2>&1; then
    echo "ensure-system: installing PostgreSQL"
    apt_install postgresql
    fresh=1
  fi
  version=$(ls /etc/postgresql | sort -V | tail -n 1)
  echo "ensure-system: starting PostgreSQL $version"
  $SUDO pg_ctlcluster --skip-systemctl-redirect "$version" main start || true
  for _ in $(seq 1 60); do pg_ready && break; sleep 0.5; done
  pg_ready || { echo "ensure-system: PostgreSQL did not start" >&2; exit 1; }
  if [ -n "$fresh" ]; then
    # A fresh Debian cluster asks for passwords over TCP; the throwaway test cluster trusts
    # local connections, as the machines this project runs on do.
    hba="/etc/postgresql/$version/main/pg_hba.conf"
    $SUDO sed -i '1i host all all 127.0.0.1/32 trust' "$hba"
    $SUDO pg_ctlcluster --skip-systemctl-redirect "$version" main reload
  fi
fi

redis_ready() { redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1; }
if ! redis_ready; then
  if ! command -v redis-server >/dev/null 2>&1; then
    echo "ensure-system: installing Redis"
    apt_install redis-server
  fi
  echo "ensure-system: starting Redis"
  $SUDO mkdir -p /var/lib/redis /var/log/redis
  $SUDO redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save "" --appendonly no \
    --dir /var/lib/redis --logfile /var/log/redis/trainvitals.log
  for _ in $(seq 1 60); do redis_ready && break; sleep 0.5; done
  redis_ready || { echo "ensure-system: Redis did not start" >&2; exit 1; }
fi
