#!/usr/bin/env bash
# Mount bpffs at /sys/fs/bpf if it is not mounted (tests and rivorad pin there).
set -euo pipefail
if ! grep -qs ' /sys/fs/bpf bpf ' /proc/mounts; then
	mkdir -p /sys/fs/bpf
	mount -t bpf bpffs /sys/fs/bpf || { echo "bpffs: cannot mount bpffs at /sys/fs/bpf" >&2; exit 1; }
fi
