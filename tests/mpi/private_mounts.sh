# Sourced by the tests that give MPI ranks private directories (ckpt_private_dir.sh,
# ckpt_levels_private_dir.sh): require_private_mounts exits 77 (skipped) with the reason unless
# this process may create a mount namespace with a tmpfs in it (root, unshare, permitted here).
require_private_mounts() {
  local probe
  skip() {
    echo "SKIPPED: $*"
    exit 77
  }
  [ "$(id -u)" -eq 0 ] || skip "a private mount namespace (unshare -m, mount -t tmpfs) needs root"
  command -v unshare >/dev/null || skip "unshare not found (Debian: util-linux)"
  probe=$(mktemp -d /tmp/dtrain-ns-probe.XXXXXX)
  unshare -m --propagation private sh -c "mount -t tmpfs none '$probe'" 2>/dev/null ||
    { rmdir "$probe"; skip "mount namespaces are not permitted here (unshare -m failed)"; }
  rmdir "$probe"
}
