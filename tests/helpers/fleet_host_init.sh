#!/bin/sh
# PID 1 of one fake fleet host (started by tests/helpers/fleet.py as
#   nsenter --net=/run/netns/<host> unshare --mount --uts --pid --fork --kill-child --mount-proc sh fleet_host_init.sh ...).
# It already runs in the host's own network, mount, UTS and PID namespaces; here it gives the host its name and
# its private state (everything podman and the role write), starts the host's sshd and becomes its init.
#   $1 host name   $2 the host's directory (private state, sshd_config)   $3 the deploy directory (mount point)
#   $4 the fleet's prefix (unused here: it marks the launcher's command line as this fleet's)
set -eu
name="$1"
hostdir="$2"
deploy_dir="$3"

hostname "$name"
# /run (podman's runroot and tmpdir, runc's state, sshd's privilege separation directory) is the host's own.
mount -t tmpfs -o mode=0755 "fleet-$name-run" /run
mkdir -p /run/sshd /run/lock /run/containers /run/libpod
# Podman's configuration (storage.conf: graphroot, runroot, the shared read-only image store) and its storage.
mount --bind "$hostdir/etc-containers" /etc/containers
# (The mount point is podman's own graphroot: absent on a machine where podman has stored nothing yet.)
mkdir -p /var/lib/containers
mount --bind "$hostdir/containers" /var/lib/containers
# The deploy directory: the same path on every host, a different directory behind it.
mount --bind "$hostdir/deploy" "$deploy_dir"
# root's home (ansible_user root) is the host's own, empty directory (its passwd, written by fleet.py, says so), so
# that an ssh session runs no start-up file of this machine's root (bash reads ~/.bashrc for every ssh command)
# and Ansible's remote temporary directory is the host's.
mount --bind "$hostdir/passwd" /etc/passwd
# sshd daemonizes (a child of this PID 1), so that a test can kill it alone and start it again: the host keeps
# running its containers without it. catatonit, podman's init, stays PID 1 and reaps orphans.
/usr/sbin/sshd -f "$hostdir/sshd_config" -E "$hostdir/sshd.log"
exec catatonit -P
